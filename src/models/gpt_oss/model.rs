//! `GptOssModel`: gpt-oss (20b/120b) on the runtime's pieces. Dense tensors (attention, router,
//! norms, embedding, lm_head) are read in their stored BF16 form from memory-mapped shards
//! through the crate's dense kernels (the page cache holds them; nothing is widened to an fp32
//! copy); the routed experts stream through any `ExpertProvider` (the tiered store: RAM tier,
//! direct reads, prefetch) and run on the MoE executor. Per-sequence state is one key/value
//! row cache per layer in `SeqState` (`LayerState::Rows`), so snapshots, marks and saved states
//! work as for K3. Owns gpt-oss's forward order; must not touch the network.

use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::Dtype;

use crate::checkpoint::Inventory;
use crate::experts::{ExpertProvider, TieredExperts, TieredOptions};
use crate::kernels::dense::{gemm, DenseData, DenseMatrix};
use crate::moe::{ExecOptions, Gating, Route, RoutedExperts};
use crate::runtime::memory::MemoryPlan;
use crate::runtime::observe::{Event, Observer, Observers, PrefillStep};
use crate::runtime::row_cache::RowCache;
use crate::runtime::state::{LayerState, SeqState};
use crate::{Error, Result};

use super::config::GptOssConfig;
use super::names;
use super::pass::PassSeq;
use super::plan::GptOssOptions;
use super::rope::Rope;
use super::weights::{load_layer, matrix, to_f32, vector, Layer, Linear, Stored};

/// gpt-oss, loaded.
pub struct GptOssModel {
    cfg: GptOssConfig,
    maps: Vec<Mmap>,
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
    /// Always the CPU (what `Model::device` hands out).
    pub(super) device: candle::Device,
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
        o: &GptOssOptions,
        report: impl FnOnce(&MemoryPlan),
    ) -> Result<Self> {
        let cfg = GptOssConfig::from_file(&root.join("config.json"))?;
        let inv = Inventory::from_dir(root)?;
        let plan = super::plan::plan(&cfg, &inv, o)?;
        report(&plan);
        let index = names::expert_index(&inv, &cfg)?;
        let inv = Arc::new(inv);
        let opts = super::plan::store_options(&plan, o);
        // Local shards (a full install), or the disk cache and the hub (a streaming one).
        let store =
            crate::installed::expert_store(root, inv.clone(), Arc::new(index), &opts, None)?;
        let streaming = crate::installed::read_manifest(root)
            .is_some_and(|m| m.mode == crate::installed::Mode::Stream);
        let dense = match streaming {
            // The shards are on the hub: the dense tensors come from the install's copy.
            true => Arc::new(Inventory::from_dir(&super::dense::dense_dir(root))?),
            false => inv,
        };
        let mut m = Self::with_experts(cfg, &dense, Arc::new(store))?;
        m.context_limit = plan.context;
        m.pass = plan.prefill_pass.max(1);
        m.plan = Some(plan);
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
        let maps = inv
            .shards
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let p = inv.shard_path(i);
                let f = std::fs::File::open(&p).map_err(|e| Error::io(&p, e))?;
                // SAFETY: the shard is opened read-only; the model never writes it, and a
                // checkpoint replaced underneath a running engine is outside its contract
                // (installs write new files and rename them into place).
                unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&p, e))
            })
            .collect::<Result<Vec<_>>>()?;
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = matrix(inv, names::EMBED, v, h)?;
        let lm_head = matrix(inv, names::LM_HEAD, v, h)?;
        let norm = vector(inv, &maps, names::NORM, h)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|l| load_layer(inv, &maps, &cfg, l))
            .collect::<Result<Vec<_>>>()?;
        let moe = RoutedExperts {
            ffn: names::expert_ffn(&cfg),
            top_k: cfg.top_k(),
        };
        Ok(GptOssModel {
            rope: Rope::new(&cfg),
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
            device: candle::Device::Cpu,
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
        SeqState {
            pos: 0,
            layers: self
                .layers
                .iter()
                .map(|l| LayerState::Rows(RowCache::new(l.shape.row_width(), self.context_limit)))
                .collect(),
        }
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
        self.maps.iter().map(|m| m.len() as u64).sum()
    }

    /// `hidden` with the model's observers and no cancel flag.
    fn pass_rows(&self, ids: &[u32], state: &mut SeqState) -> Result<Vec<f32>> {
        self.hidden(ids, state, &self.observers, None, None)?
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

    /// The final hidden rows `[T, hidden]` of one sequence (`hidden_seqs` with one).
    pub(super) fn hidden(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        obs: &dyn Observer,
        cancel: Option<&std::sync::atomic::AtomicBool>,
        prefill: Option<PrefillStep>,
    ) -> Result<Option<Vec<f32>>> {
        self.hidden_seqs(&mut [PassSeq { ids, state }], obs, cancel, prefill)
    }

    /// Layers.
    pub(super) fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Layer `l`'s weights.
    pub(super) fn layer(&self, l: usize) -> &Layer {
        &self.layers[l]
    }

    /// The rotary embedding.
    pub(super) fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Refuses empty input, ids past the vocabulary and growth past the context limit (a
    /// state of another model's layout is refused by the pass itself).
    pub fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Msg("no input ids".into()));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= self.cfg.vocab_size) {
            return Err(Error::Msg(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.cfg.vocab_size
            )));
        }
        let needed = state.pos + ids.len();
        if needed > self.context_limit {
            return Err(Error::ContextLimit {
                needed,
                limit: self.context_limit,
            });
        }
        Ok(())
    }

    fn bytes(&self, s: &Stored) -> &[u8] {
        &self.maps[s.shard][s.start..s.end]
    }

    fn dense(&self, s: &Stored) -> Result<DenseMatrix<'_>> {
        let b = self.bytes(s);
        let data = match s.dtype {
            Dtype::F32 => DenseData::F32(b),
            _ => DenseData::Bf16(b),
        };
        DenseMatrix::new(data, s.rows, s.cols)
    }

    /// `x · Wᵀ + b` for `t` rows.
    pub(super) fn linear(&self, p: &Linear, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; t * p.w.rows];
        gemm(&self.dense(&p.w)?, x, t, &mut y)?;
        for row in y.chunks_exact_mut(p.b.len()) {
            row.iter_mut().zip(&p.b).for_each(|(a, c)| *a += c);
        }
        Ok(y)
    }

    pub(super) fn embed_rows(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let width = if self.embed.dtype == Dtype::F32 { 4 } else { 2 };
        let all = self.bytes(&self.embed);
        Ok(ids
            .iter()
            .flat_map(|&i| {
                to_f32(
                    &all[i as usize * h * width..][..h * width],
                    self.embed.dtype,
                )
            })
            .collect())
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
        let mut y = vec![0f32; t * self.cfg.vocab_size];
        gemm(&self.dense(&self.lm_head)?, &n, t, &mut y)?;
        Ok(y)
    }
}

/// `w · x / sqrt(mean(x²) + eps)` per row of `x`.
pub(super) fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(w.len())
        .zip(x.par_chunks(w.len()))
        .for_each(|(o, r)| {
            let ms = r.iter().map(|v| v * v).sum::<f32>() / r.len() as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((a, b), c) in o.iter_mut().zip(r).zip(w) {
                *a = c * (b * inv);
            }
        });
    out
}
