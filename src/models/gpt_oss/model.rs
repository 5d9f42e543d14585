//! `GptOssModel`: gpt-oss (20b/120b) on the runtime's pieces. Dense tensors (attention, router,
//! norms, embedding, lm_head) are read in their stored BF16 form from memory-mapped shards
//! through the crate's dense kernels (the page cache holds them; nothing is widened to an fp32
//! copy); the routed experts stream through any `ExpertProvider` (the tiered store: RAM tier,
//! direct reads, prefetch) and run on the MoE executor. Per-sequence state is one key/value
//! row cache per layer in `SeqState` (`LayerState::Rows`), so snapshots, marks and saved states
//! work as for K3. Owns gpt-oss's forward order; must not touch the network.

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Inventory;
use crate::experts::{ExpertProvider, TieredExperts, TieredOptions};
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::layers::norm::rms_norm;
use crate::layers::row_pass;
use crate::moe::{ExecOptions, Gating, Route, RoutedExperts};
use crate::runtime::memory::MemoryPlan;
use crate::runtime::observe::{Event, Observer, Observers};
use crate::runtime::state::SeqState;
use crate::{Error, Result};

use super::config::GptOssConfig;
use super::names;
use super::plan::shape;
use super::rope::{rope, Rope};
use super::weights::{load_layer, Layer, Linear};
use crate::runtime::load::LoadOptions;

/// gpt-oss, loaded.
pub struct GptOssModel {
    cfg: GptOssConfig,
    maps: Mapped,
    layers: Vec<Layer>,
    embed: Stored,
    norm: Vec<f32>,
    lm_head: Stored,
    rope: Rope,
    moe: RoutedExperts,
    experts: Arc<dyn ExpertProvider>,
    exec: ExecOptions,
    context_limit: usize,
    /// Positions per prefill pass (bounds the activations a long prompt holds).
    pass: usize,
    plan: Option<MemoryPlan>,
    observers: Observers,
}

impl GptOssModel {
    /// Opens `root` (config.json and the shards) with the experts in a tiered store as `opts`
    /// says (no memory plan: tests and custom loading; `open_planned` is the front ends' way).
    pub fn open(root: &Path, opts: &TieredOptions) -> Result<Self> {
        let cfg = GptOssConfig::from_file(&root.join("config.json"))?;
        let inv = Inventory::from_dir(root)?;
        let index = names::expert_index(&inv, &cfg)?;
        let inv = Arc::new(inv);
        let store = TieredExperts::new(Arc::new(index), Some(inv.clone()), None, opts)?;
        Self::with_experts(cfg, &inv, Arc::new(store))
    }

    /// Opens `root` under the memory plan (shown to `report` before anything large is read):
    /// the expert RAM tier, prefetch cap, context limit and prefill pass are the plan's.
    pub fn open_planned(
        root: &Path,
        o: &LoadOptions,
        mut report: impl FnMut(&MemoryPlan),
    ) -> Result<Self> {
        let cfg = GptOssConfig::from_file(&root.join("config.json"))?;
        let index = names::expert_index(&Inventory::from_dir(root)?, &cfg)?;
        let opened = crate::layers::plan::open(root, &shape(&cfg), index, o, &mut report)?;
        let mut m = Self::with_experts(cfg, &opened.dense, opened.experts)?;
        m.context_limit = opened.plan.context;
        m.pass = opened.plan.prefill_pass.max(1);
        m.exec.expert_batch = opened.plan.expert_batch;
        m.exec.kernel = o.kernel;
        m.exec.dense = o.dense_kernel;
        m.maps.set_kernel(o.dense_kernel);
        m.plan = Some(opened.plan);
        Ok(m)
    }

    /// The memory plan the model was opened under (`open_planned`).
    pub fn plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// The model over an already built expert provider.
    pub fn with_experts(
        cfg: GptOssConfig,
        inv: &Inventory,
        experts: Arc<dyn ExpertProvider>,
    ) -> Result<Self> {
        let maps = Mapped::open(inv)?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = matrix(inv, names::EMBED, v, h)?;
        let lm_head = matrix(inv, names::LM_HEAD, v, h)?;
        let norm = maps.vector(inv, names::NORM, h)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| load_layer(inv, &maps, &cfg, l))
            .collect::<Result<Vec<_>>>()?;
        let moe = RoutedExperts {
            ffn: names::expert_ffn(&cfg),
            top_k: cfg.top_k(),
        };
        Ok(GptOssModel {
            rope: rope(&cfg),
            context_limit: cfg.max_position_embeddings,
            cfg,
            maps,
            layers,
            embed,
            norm,
            lm_head,
            moe,
            experts,
            exec: ExecOptions::default(),
            pass: 2048,
            plan: None,
            observers: Observers::default(),
        })
    }

    /// The config.
    pub fn config(&self) -> &GptOssConfig {
        &self.cfg
    }

    /// The expert provider.
    pub fn experts(&self) -> &Arc<dyn ExpertProvider> {
        &self.experts
    }

    /// Attaches an observer (it sees `PassStart`, each MoE layer's `Routes`, `PassEnd`).
    pub fn observe(&mut self, o: Arc<dyn Observer>) {
        self.observers.push(o);
    }

    /// Positions a sequence may hold.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    /// Lowers (or, up to `max_position_embeddings`, raises) the context limit.
    pub fn set_context_limit(&mut self, n: usize) {
        self.context_limit = n.clamp(1, self.cfg.max_position_embeddings);
    }

    /// An empty sequence: one key/value row cache per layer.
    pub fn new_state(&self) -> SeqState {
        row_pass::new_state(
            self.layers.iter().map(|l| l.shape.row_width()),
            self.context_limit,
        )
    }

    /// Feeds `ids` (in passes of the plan's prefill length; every row's arithmetic is its
    /// own, so the split changes no bit) and returns the last position's logits `[vocab]`.
    pub fn forward(&self, ids: &[u32], state: &mut SeqState) -> Result<Vec<f32>> {
        self.check_input(ids, state)?;
        let mut last = Vec::new();
        for piece in ids.chunks(self.pass) {
            last = self.pass_rows(piece, state)?;
        }
        let h = self.cfg.hidden_size;
        self.logits(&last[last.len() - h..], 1)
    }

    /// Feeds `ids` and returns every position's logits `[T, vocab]` (row-major).
    pub fn forward_all(&self, ids: &[u32], state: &mut SeqState) -> Result<Vec<f32>> {
        let x = self.pass_rows(ids, state)?;
        self.logits(&x, ids.len())
    }

    /// Expert bytes read from storage so far (the dense weights are mapped and resident).
    pub fn bytes_read(&self) -> u64 {
        self.experts.stats().map_or(0, |s| s.bytes_read())
    }

    /// Positions per prefill pass.
    pub fn pass_len(&self) -> usize {
        self.pass
    }

    /// Bytes of dense weights the model maps (resident: never re-read per token).
    pub fn dense_bytes(&self) -> u64 {
        self.maps.len()
    }

    /// `hidden` with the model's observers and no cancel flag.
    fn pass_rows(&self, ids: &[u32], state: &mut SeqState) -> Result<Vec<f32>> {
        row_pass::hidden(self, ids, state, &self.observers, None, None)?
            .ok_or_else(|| Error::Msg("a pass without a cancel flag stopped".into()))
    }

    /// The model's own observers.
    pub(super) fn observers(&self) -> &Observers {
        &self.observers
    }

    /// Removes every observer.
    pub fn clear_observers(&mut self) {
        self.observers.clear();
    }

    /// Layer `l`'s weights.
    pub(super) fn layer(&self, l: usize) -> &Layer {
        &self.layers[l]
    }

    /// The rotary embedding.
    pub(super) fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Refuses empty input, ids past the vocabulary and growth past the context limit.
    pub fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        row_pass::check_ids(ids, state, self.cfg.vocab_size, self.context_limit)
    }

    /// `x · Wᵀ + b` for `t` rows.
    pub(super) fn linear(&self, p: &Linear, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let mut y = self.maps.matmul(&p.w, x, t)?;
        for row in y.chunks_exact_mut(p.b.len()) {
            row.iter_mut().zip(&p.b).for_each(|(a, c)| *a += c);
        }
        Ok(y)
    }

    /// Embedding rows of `ids`.
    pub(super) fn embed_rows(&self, ids: &[u32]) -> Vec<f32> {
        self.maps.rows(&self.embed, ids)
    }

    /// `x += experts(post_norm(x))`, routed by the softmax over the top-k router logits.
    pub(super) fn mlp(
        &self,
        l: usize,
        layer: &Layer,
        x: &mut [f32],
        obs: &dyn Observer,
    ) -> Result<()> {
        let h = self.cfg.hidden_size;
        let t = x.len() / h;
        let n = rms_norm(x, &layer.post_norm, self.cfg.rms_norm_eps as f32);
        let logits = self.linear(&layer.router, &n, t)?;
        let e = self.cfg.num_local_experts;
        let routes: Vec<Route> = logits
            .chunks_exact(e)
            .map(|r| Gating::TopKSoftmax.route(r, &[], self.moe.top_k))
            .collect();
        obs.on(l, &Event::Routes(&routes));
        let y = self.moe.run(
            l,
            &routes,
            n,
            &candle::Device::Cpu,
            self.experts.as_ref(),
            &self.exec,
        )?;
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// `lm_head(norm(x))` for `t` rows.
    pub(super) fn logits(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let n = rms_norm(x, &self.norm, self.cfg.rms_norm_eps as f32);
        self.maps.matmul(&self.lm_head, &n, t)
    }
}
