//! `Qwen3MoeModel`: Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B) on the
//! runtime's pieces. Dense tensors (attention, q/k norms, routers, dense MLP layers, norms,
//! embedding, lm_head) are read in their stored BF16 form from memory-mapped shards through
//! the crate's dense kernels (the page cache holds them; nothing is widened to an fp32 copy);
//! the routed BF16 experts stream through any `ExpertProvider` (the tiered store: RAM tier,
//! direct reads, prefetch, disk cache and hub) and run on the MoE executor. Per-sequence state
//! is one key/value row cache per layer (`LayerState::Rows`), so snapshots, marks, verify and
//! batching are the row-cache family's (`layers::row_pass`). Owns the model's fields and
//! loading; the layer's order is `pass.rs`'s.

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Inventory;
use crate::experts::{ExpertProvider, TieredExperts, TieredOptions};
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::layers::norm::rms_norm;
use crate::layers::rope::Rope;
use crate::layers::row_pass;
use crate::moe::{ExecOptions, RoutedExperts};
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::observe::{Observer, Observers};
use crate::runtime::state::SeqState;
use crate::{Error, Result};

use super::config::Qwen3MoeConfig;
use super::names;
use super::plan::shape;
use super::weights::{load_layer, Layer};

/// Qwen3-MoE, loaded.
pub struct Qwen3MoeModel {
    pub(super) cfg: Qwen3MoeConfig,
    pub(super) maps: Mapped,
    pub(super) layers: Vec<Layer>,
    embed: Stored,
    norm: Vec<f32>,
    lm_head: Stored,
    pub(super) rope: Rope,
    pub(super) moe: RoutedExperts,
    pub(super) experts: Arc<dyn ExpertProvider>,
    pub(super) exec: ExecOptions,
    context_limit: usize,
    /// Positions per prefill pass (bounds the activations a long prompt holds).
    pass: usize,
    plan: Option<MemoryPlan>,
    pub(super) observers: Observers,
}

impl Qwen3MoeModel {
    /// Opens `root` (config.json and the shards) with the experts in a tiered store as `opts`
    /// says (no memory plan: tests and custom loading; `open_planned` is the front ends' way).
    pub fn open(root: &Path, opts: &TieredOptions) -> Result<Self> {
        let cfg = Qwen3MoeConfig::from_file(&root.join("config.json"))?;
        let inv = Inventory::from_dir(root)?;
        let index = names::expert_index(&inv, &cfg)?;
        let inv = Arc::new(inv);
        let store = TieredExperts::new(Arc::new(index), Some(inv.clone()), None, opts)?;
        Self::with_experts(cfg, &inv, Arc::new(store))
    }

    /// Opens `root` under the memory plan (shown to `report` before anything large is read):
    /// the expert RAM tier, prefetch cap, context limit and prefill pass are the plan's; the
    /// experts come from local shards (a full install) or the disk cache and the hub (a
    /// streaming one).
    pub fn open_planned(
        root: &Path,
        o: &LoadOptions,
        mut report: impl FnMut(&MemoryPlan),
    ) -> Result<Self> {
        let cfg = Qwen3MoeConfig::from_file(&root.join("config.json"))?;
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

    /// The model over an already built expert provider.
    pub fn with_experts(
        cfg: Qwen3MoeConfig,
        inv: &Inventory,
        experts: Arc<dyn ExpertProvider>,
    ) -> Result<Self> {
        let maps = Mapped::open(inv)?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = matrix(inv, names::EMBED, v, h)?;
        let lm_head = match cfg.tie_word_embeddings {
            true => embed,
            false => matrix(inv, names::LM_HEAD, v, h)?,
        };
        let norm = maps.vector(inv, names::NORM, h)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| load_layer(inv, &maps, &cfg, l))
            .collect::<Result<Vec<_>>>()?;
        let moe = RoutedExperts {
            ffn: names::expert_ffn(&cfg),
            top_k: cfg.num_experts_per_tok,
        };
        Ok(Qwen3MoeModel {
            rope: Rope::plain(cfg.rope_theta, cfg.head_dim()),
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
    pub fn config(&self) -> &Qwen3MoeConfig {
        &self.cfg
    }

    /// The memory plan the model was opened under (`open_planned`).
    pub fn plan(&self) -> Option<&MemoryPlan> {
        self.plan.as_ref()
    }

    /// The expert provider.
    pub fn experts(&self) -> &Arc<dyn ExpertProvider> {
        &self.experts
    }

    /// Attaches an observer (it sees `PassStart`, each MoE layer's `Routes`, `PassEnd`).
    pub fn observe(&mut self, o: Arc<dyn Observer>) {
        self.observers.push(o);
    }

    /// Removes every observer.
    pub fn clear_observers(&mut self) {
        self.observers.clear();
    }

    /// Positions a sequence may hold.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    /// Lowers (or, up to `max_position_embeddings`, raises) the context limit.
    pub fn set_context_limit(&mut self, n: usize) {
        self.context_limit = n.clamp(1, self.cfg.max_position_embeddings);
    }

    /// Positions per prefill pass.
    pub fn pass_len(&self) -> usize {
        self.pass
    }

    /// Expert bytes read from storage so far (the dense weights are mapped and resident).
    pub fn bytes_read(&self) -> u64 {
        self.experts.stats().map_or(0, |s| s.bytes_read())
    }

    /// Bytes of dense weights the model maps (resident: never re-read per token).
    pub fn dense_bytes(&self) -> u64 {
        self.maps.len()
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
            last = row_pass::hidden(self, piece, state, &self.observers, None, None)?
                .ok_or_else(|| Error::Msg("a pass without a cancel flag stopped".into()))?;
        }
        let h = self.cfg.hidden_size;
        self.logits(&last[last.len() - h..], 1)
    }

    /// Refuses empty input, ids past the vocabulary and growth past the context limit.
    pub fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        row_pass::check_ids(ids, state, self.cfg.vocab_size, self.context_limit)
    }

    /// Embedding rows of `ids`.
    pub(super) fn embed_rows(&self, ids: &[u32]) -> Vec<f32> {
        self.maps.rows(&self.embed, ids)
    }

    /// `lm_head(norm(x))` for `t` rows.
    pub(super) fn logits(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let n = rms_norm(x, &self.norm, self.cfg.rms_norm_eps as f32);
        self.maps.matmul(&self.lm_head, &n, t)
    }
}
