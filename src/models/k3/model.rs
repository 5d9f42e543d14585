//! The whole K3 language model (spec §3.3, §3.8): embedding, the decoder layers with Block
//! Attention Residuals, and the tail. Small tensors are loaded once; each layer's matrices come
//! from the `Spine` at every pass (pinned or streamed through the template buffers).

use std::sync::Arc;

use candle::{Device, Tensor};

use super::attn_res::AttnRes;
use super::layer::{column, with, Layer, PassCtx, SeqLayer};
use super::ops::rms_norm;
use super::options::ModelOptions;
use super::weights::LayerWeights;
use crate::runtime::model::{Forward, Logits, Output};
use crate::runtime::observe::{Both, Event, Observer, Observers, PrefillStep};
use crate::runtime::rollback::LayerUndo;
use crate::runtime::state::SeqState;

use crate::compute::dense;
use crate::experts::ExpertProvider;
use crate::models::k3::config::K3Config;
use crate::spine::source::Spine;
use crate::Result;

/// What a pass checks and reports besides its math.
#[derive(Default, Clone, Copy)]
pub(super) struct Control<'a> {
    /// Stop between layers when set.
    cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// Report each layer as a step of this prefill.
    prefill: Option<PrefillStep>,
}

/// Kimi K3.
pub struct K3Model {
    cfg: K3Config,
    spine: Arc<Spine>,
    experts: Arc<dyn ExpertProvider>,
    layers: Vec<Layer>,
    out_res: AttnRes,
    final_norm: Tensor,
    /// `lm_head` `[vocab, H]`, bound in the resident tail.
    lm_head: crate::spine::slot::Slot,
    /// Evaluation options.
    pub options: ModelOptions,
    /// Who watches each pass (the layer profile, the router trace, ...).
    observers: Observers,
    /// Most positions a sequence may hold (the config's, or the memory plan's).
    pub(crate) context_limit: usize,
    /// The memory plan the model was loaded under, if any.
    pub(crate) plan: Option<crate::runtime::memory::MemoryPlan>,
}

impl K3Model {
    /// Builds the model from a config, a spine and an expert provider.
    pub fn load(
        cfg: K3Config,
        spine: Arc<Spine>,
        experts: Arc<dyn ExpertProvider>,
    ) -> Result<Self> {
        let t = cfg.text();
        let h = t.hidden_size;
        let eps = t.rms_norm_eps;
        let device = spine.device().clone();
        let mut layers = Vec::with_capacity(cfg.num_layers());
        for (l, kind) in cfg.schedule.iter().enumerate() {
            let small = spine.small(l)?;
            let layout = spine.layout(l)?;
            let w = LayerWeights {
                cfg: &cfg,
                small: super::weights::var_builder(&small, &device)?,
                layout: &layout,
                layer: l,
            };
            layers.push(Layer::load(&w, kind)?);
        }
        let g = spine.global();
        let out_res = AttnRes::new(
            &g.tensor("model.output_attn_res_norm.weight", &[h], &device)?,
            &g.tensor("model.output_attn_res_proj.weight", &[1, h], &device)?,
            eps,
        )?;
        let final_norm = g.tensor("model.norm.weight", &[h], &device)?;
        let lm_head = crate::spine::slot::bind(g.layout(), "lm_head.weight", t.vocab_size, h)?;
        let context_limit = t.max_position_embeddings.unwrap_or(usize::MAX);
        Ok(K3Model {
            cfg,
            spine,
            experts,
            layers,
            out_res,
            final_norm,
            lm_head,
            context_limit,
            options: ModelOptions::default(),
            observers: Observers::default(),
            plan: None,
        })
    }

    /// The memory plan the model was loaded under (`None` for `from_dir_with`).
    pub fn plan(&self) -> Option<&crate::runtime::memory::MemoryPlan> {
        self.plan.as_ref()
    }

    /// Most positions a sequence may hold.
    pub fn context_limit(&self) -> usize {
        self.context_limit
    }

    /// Sets the context limit (at most the config's `max_position_embeddings`).
    pub fn set_context_limit(&mut self, n: usize) {
        let max = self
            .cfg
            .text()
            .max_position_embeddings
            .unwrap_or(usize::MAX);
        self.context_limit = n.min(max);
    }

    /// The config.
    pub fn config(&self) -> &K3Config {
        &self.cfg
    }

    /// The spine.
    pub fn spine(&self) -> &Spine {
        &self.spine
    }

    /// Where experts came from so far, when the provider counts it.
    pub fn expert_stats(&self) -> Option<crate::experts::ExpertStats> {
        self.experts.stats()
    }

    /// Bytes read from storage so far: streamed spine layers and expert spans (from homes,
    /// shards, the disk cache and the hub).
    pub fn bytes_read(&self) -> u64 {
        let e = self
            .experts
            .stats()
            .map(|s| s.home_bytes + s.disk_bytes + s.shard_bytes + s.hub_bytes)
            .unwrap_or(0);
        self.spine.bytes_read() + e
    }

    /// The expert provider.
    pub fn experts(&self) -> &Arc<dyn ExpertProvider> {
        &self.experts
    }

    /// The observers attached to every pass.
    pub(super) fn observers(&self) -> &Observers {
        &self.observers
    }

    /// Number of decoder layers.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Attaches an observer to every pass from now on.
    pub fn observe(&mut self, o: Arc<dyn Observer>) {
        self.observers.push(o);
    }

    /// Detaches every observer.
    pub fn clear_observers(&mut self) {
        self.observers.clear();
    }

    /// The device of the spine.
    pub fn device(&self) -> &Device {
        self.spine.device()
    }

    /// A fresh sequence state.
    pub fn new_state(&self) -> SeqState {
        SeqState {
            pos: 0,
            layers: self
                .layers
                .iter()
                .map(|l| l.new_state(self.context_limit))
                .collect(),
        }
    }

    /// Layer `l`'s attention alone on the normalised input `x` `[T, H]`, with that layer's data
    /// `ld` (`Spine::load_layer`): for benchmarks and tests of one layer at a chosen context.
    pub fn attention(
        &self,
        l: usize,
        x: &Tensor,
        state: &mut SeqState,
        ld: &crate::spine::layer::LayerData,
    ) -> Result<Tensor> {
        let layer = self
            .layers
            .get(l)
            .ok_or_else(|| crate::Error::Msg(format!("no layer {l}")))?;
        let st = state
            .layers
            .get_mut(l)
            .ok_or_else(|| crate::Error::Msg(format!("the state has no layer {l}")))?;
        layer.attention(x, st, &self.options, ld, None)
    }

    /// The one forward entry: consumes `ids` into `state` as `f` says (which logits, an
    /// observer for this call, a cancel flag checked between layers, an undo record) and returns
    /// the logits, or `None` when `cancel` was set (with `state` returned to where it was).
    /// Without `undo` the positions run in layer-major passes of `ModelOptions::prefill_pass`;
    /// with it, in one pass (a verify pass: `Output::rollback` keeps any prefix of it without
    /// reading weights again, bit-identical to that many single steps).
    pub fn run(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        f: &Forward<'_>,
    ) -> Result<Option<Output>> {
        self.check_input(ids, state)?;
        if f.undo {
            return self.run_verify(ids, state, f).map(Some);
        }
        let mark = f.cancel.map(|_| state.mark());
        let (mut last, mut rows) = (None, Vec::new());
        let len = self.options.pass_len();
        let passes = ids.len().div_ceil(len);
        let read_before = self.bytes_read();
        for (p, pass) in ids.chunks(len).enumerate() {
            let ctl = Control {
                cancel: f.cancel,
                prefill: (ids.len() > 1).then_some(PrefillStep {
                    layer: 0,
                    layers: self.layers.len(),
                    pass: p,
                    passes,
                    pass_first: p * len,
                    pass_tokens: pass.len(),
                    positions: ids.len(),
                    read_before,
                    read_now: read_before,
                }),
            };
            let mut seq = [PassSeq {
                ids: pass,
                state: &mut *state,
                undo: None,
            }];
            let out = match f.observer {
                Some(o) => self.run_layers(&mut seq, &Both(&self.observers, o), ctl)?,
                None => self.run_layers(&mut seq, &self.observers, ctl)?,
            };
            let Some(hs) = out.and_then(|mut v| v.pop()) else {
                if let Some(m) = mark {
                    state.rewind(m);
                }
                return Ok(None);
            };
            match f.logits {
                Logits::Last => last = hs.into_iter().last(),
                Logits::All => {
                    for h in hs {
                        rows.push(self.tail(&h)?);
                    }
                }
            }
        }
        let logits = match f.logits {
            Logits::Last => {
                let h = last.ok_or_else(|| crate::Error::Msg("empty input".into()))?;
                let n = h.dim(0)?;
                self.tail(&h.narrow(0, n - 1, 1)?)?.squeeze(0)?
            }
            Logits::All => Tensor::cat(&rows, 0)?,
        };
        Ok(Some(Output {
            logits,
            rollback: None,
        }))
    }

    /// `run` with an undo record: every position in one pass, logits of every row.
    pub(super) fn run_verify(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        f: &Forward<'_>,
    ) -> Result<Output> {
        let pos = state.pos;
        let mut seq = [PassSeq {
            ids,
            state,
            undo: Some(Vec::with_capacity(self.layers.len())),
        }];
        let ctl = Control::default();
        let mut h = match f.observer {
            Some(o) => self.run_layers(&mut seq, &Both(&self.observers, o), ctl)?,
            None => self.run_layers(&mut seq, &self.observers, ctl)?,
        }
        .and_then(|mut v| v.pop())
        .ok_or_else(|| crate::Error::Msg("verify was cancelled".into()))?;
        let h = h
            .pop()
            .ok_or_else(|| crate::Error::Msg("verify got no rows".into()))?;
        let [PassSeq { undo, .. }] = seq;
        let rollback = crate::runtime::rollback::Rollback {
            pos,
            rows: ids.len(),
            layers: undo.unwrap_or_default(),
        };
        Ok(Output {
            logits: self.tail(&h)?,
            rollback: Some(rollback),
        })
    }

    /// Checks that `n` more positions fit the context limit and the vocabulary.
    pub fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        if ids.is_empty() {
            return Err(crate::Error::Msg("forward needs at least one token".into()));
        }
        let vocab = self.cfg.text().vocab_size;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(crate::Error::Msg(format!(
                "token id {bad} is outside the vocabulary (0..{vocab})"
            )));
        }
        if state.pos + ids.len() > self.context_limit {
            return Err(crate::Error::ContextLimit {
                needed: state.pos + ids.len(),
                limit: self.context_limit,
            });
        }
        Ok(())
    }

    /// Keeps the first `rows` positions of a verify pass (`Rollback::keep`) and tells the
    /// observers (`Event::Kept`), so a router trace drops the rejected drafts' routes.
    pub fn keep(
        &self,
        rb: crate::runtime::rollback::Rollback,
        state: &mut SeqState,
        rows: usize,
    ) -> Result<()> {
        rb.keep(state, rows)?;
        self.observers.on(0, &Event::Kept { rows });
        Ok(())
    }

    /// Final norm and `lm_head` over every row of `h` `[T, H]`: logits `[T, V]`.
    pub(super) fn tail(&self, h: &Tensor) -> Result<Tensor> {
        let x = rms_norm(h, &self.final_norm, self.cfg.text().rms_norm_eps)?;
        let lm_head = self.spine.global().matrix_at(&self.lm_head)?;
        dense(&x, &lm_head)
    }

    /// One layer-major pass over the rows of every sequence in `seqs`: every layer runs on
    /// all of them before the next, in chunks of `options.prefill_chunk` rows (one chunk for a
    /// sequence with an undo record, a verify pass). A sequence's chunks run in order with its
    /// own state; every op computes a row the same way whatever else is in the pass, so each
    /// sequence's rows are bit-identical to a pass of that sequence alone. Returns the tail
    /// AttnRes output per chunk (`[rows, H]` each), grouped by sequence, or `None` when
    /// `ctl.cancel` was set between layers (the states then hold part of the pass: the caller
    /// rewinds them).
    pub(super) fn run_layers(
        &self,
        seqs: &mut [PassSeq<'_>],
        obs: &dyn Observer,
        ctl: Control,
    ) -> Result<Option<Vec<Vec<Tensor>>>> {
        let t = self.cfg.text();
        let (mut h, mut owner) = (Vec::new(), Vec::new());
        for (i, s) in seqs.iter().enumerate() {
            if s.state.layers.len() != self.layers.len() {
                return Err(crate::Error::Msg(format!(
                    "the sequence state has {} layers, the model {}",
                    s.state.layers.len(),
                    self.layers.len()
                )));
            }
            let chunk = match s.undo {
                Some(_) => s.ids.len().max(1),
                None => self.options.prefill_chunk.max(1),
            };
            for c in s.ids.chunks(chunk) {
                h.push(self.spine.embed_rows(c)?); // [rows, H]
                owner.push(i);
            }
        }
        self.experts.begin_token();
        let mut pass = self.spine.pass();
        let mut anchors: Vec<Vec<Tensor>> = Vec::new();
        let cx = PassCtx {
            block_size: t.attn_res_block_size,
            eps: t.rms_norm_eps,
            options: &self.options,
            experts: self.experts.as_ref(),
            observer: obs,
        };
        let tokens = seqs.iter().map(|s| s.ids.len()).sum();
        let first_pos = seqs.first().map_or(0, |s| s.state.pos);
        obs.on(0, &Event::PassStart { first_pos, tokens });
        for (l, layer) in self.layers.iter().enumerate() {
            if ctl
                .cancel
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            {
                return Ok(None);
            }
            let ld = pass.layer(l)?;
            let (attn, ffn) = layer.kinds();
            obs.on(l, &Event::LayerReady { attn, ffn });
            let mut sl: Vec<SeqLayer> = seqs
                .iter_mut()
                .map(|s| SeqLayer {
                    state: &mut s.state.layers[l],
                    undo: s.undo.as_mut(),
                })
                .collect();
            h = layer.forward(l, h, &mut anchors, &mut sl, &owner, &ld, &cx)?;
            if let Some(step) = ctl.prefill {
                step.report(obs, l, self.bytes_read());
            }
        }
        obs.on(0, &Event::PassEnd);
        let mut out = vec![Vec::new(); seqs.len()];
        for (c, hc) in h.iter().enumerate() {
            out[owner[c]].push(self.out_res.forward(&with(&column(&anchors, c), hc))?);
        }
        for s in seqs.iter_mut() {
            s.state.pos += s.ids.len();
        }
        Ok(Some(out))
    }
}

/// One sequence's rows in a layer-major pass (`K3Model::run_layers`).
pub(super) struct PassSeq<'a> {
    /// The positions to consume.
    pub ids: &'a [u32],
    /// The sequence's state.
    pub state: &'a mut SeqState,
    /// A verify pass's undo record (one per layer, filled by the pass), else `None`.
    pub undo: Option<Vec<LayerUndo>>,
}
