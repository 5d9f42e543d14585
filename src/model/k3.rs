//! The whole K3 language model (spec §3.3, §3.8): embedding, the decoder layers with Block
//! Attention Residuals, and the tail. Small tensors are loaded once; each layer's matrices come
//! from the `Spine` at every pass (pinned or streamed through the template buffers).

use std::sync::Arc;

use candle::{Device, Tensor};

use super::attn_res::AttnRes;
use super::kda::Kda;
use super::mla::Mla;
use super::moe::{Mlp, Moe, Route};
use super::ops::rms_norm;
use super::options::ModelOptions;
use super::profile::{lap, LayerTiming};
use super::state::{LayerState, SeqState};
use super::weights::LayerWeights;

use crate::compute::dense;
use crate::config::{AttnKind, FfnKind, K3Config};
use crate::experts::ExpertProvider;
use crate::spine::source::Spine;
use crate::Result;

enum Attn {
    Kda(Box<Kda>),
    Mla(Box<Mla>),
}

enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

struct Layer {
    attn_res: AttnRes,
    mlp_res: AttnRes,
    input_norm: Tensor,
    post_norm: Tensor,
    attn: Attn,
    ffn: Ffn,
}

/// Routes chosen during a forward call: `(layer, position-in-call routes)`.
pub type RouteTrace = Vec<(usize, Vec<Route>)>;

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
    /// Router trace sink (off when `None`).
    pub router_trace: Option<super::trace::RouterTrace>,
    /// Per-layer phase timings (off when `None`).
    pub layer_profile: Option<Arc<super::profile::LayerProfile>>,
    /// Most positions a sequence may hold (the config's, or the memory plan's).
    pub(crate) context_limit: usize,
    /// The memory plan the model was loaded under, if any.
    pub(crate) plan: Option<crate::memory::MemoryPlan>,
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
                small: &small,
                layout: &layout,
                device: &device,
                layer: l,
            };
            let res = |n: &str, p: &str| -> Result<AttnRes> {
                Ok(AttnRes::new(&w.get(n, &[h])?, &w.get(p, &[1, h])?, eps)?)
            };
            layers.push(Layer {
                attn_res: res(
                    "self_attention_res_norm.weight",
                    "self_attention_res_proj.weight",
                )?,
                mlp_res: res("mlp_res_norm.weight", "mlp_res_proj.weight")?,
                input_norm: w.get("input_layernorm.weight", &[h])?,
                post_norm: w.get("post_attention_layernorm.weight", &[h])?,
                attn: match kind.attn {
                    AttnKind::Kda => Attn::Kda(Box::new(Kda::load(&w)?)),
                    AttnKind::Mla => Attn::Mla(Box::new(Mla::load(&w)?)),
                },
                ffn: match kind.ffn {
                    FfnKind::Dense => Ffn::Dense(Mlp::load(&w, "mlp", t.intermediate_size)?),
                    FfnKind::Moe => Ffn::Moe(Box::new(Moe::load(&w)?)),
                },
            });
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
            router_trace: None,
            layer_profile: None,
            plan: None,
        })
    }

    /// The memory plan the model was loaded under (`None` for `from_dir_with`).
    pub fn plan(&self) -> Option<&crate::memory::MemoryPlan> {
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
                .map(|l| match &l.attn {
                    Attn::Kda(k) => LayerState::Kda(k.new_state()),
                    Attn::Mla(m) => LayerState::Mla(m.new_state(self.context_limit)),
                })
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
        match (&layer.attn, &mut state.layers[l]) {
            (Attn::Kda(k), LayerState::Kda(s)) => k.forward(x, s, self.options.kda, ld),
            (Attn::Mla(m), LayerState::Mla(s)) => m.forward(x, s, self.options.mla, ld),
            _ => Err(crate::Error::Msg(format!(
                "layer {l}: state does not match the layer kind"
            ))),
        }
    }

    /// Consumes `ids` (in chunks of `options.prefill_chunk`) and returns the logits `[V]` of the
    /// last position.
    pub fn forward(&self, ids: &[u32], state: &mut SeqState) -> Result<Tensor> {
        self.forward_traced(ids, state, None)
    }

    /// `forward`, recording the routes of every MoE layer.
    pub fn forward_traced(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Tensor> {
        self.forward_with(ids, state, trace, None)?
            .ok_or_else(|| crate::Error::Msg("forward was cancelled".into()))
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

    /// `forward_traced` that checks `cancel` between prefill chunks: `Ok(None)` when it was
    /// set (the chunks already consumed stay in `state`).
    pub fn forward_with(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        mut trace: Option<&mut RouteTrace>,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Option<Tensor>> {
        self.check_input(ids, state)?;
        let t = self.cfg.text();
        let mut last = None;
        for chunk in ids.chunks(self.options.prefill_chunk.max(1)) {
            if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Relaxed)) {
                return Ok(None);
            }
            last = Some(self.forward_chunk(chunk, state, trace.as_deref_mut())?);
        }
        let h = last.ok_or_else(|| crate::Error::Msg("empty input".into()))?;
        let n = h.dim(0)?;
        let x = rms_norm(&h.narrow(0, n - 1, 1)?, &self.final_norm, t.rms_norm_eps)?;
        let lm_head = self.spine.global().matrix_at(&self.lm_head)?;
        Ok(Some(dense(&x, &lm_head)?.squeeze(0)?))
    }

    fn forward_chunk(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        trace: Option<&mut RouteTrace>,
    ) -> Result<Tensor> {
        let first_pos = state.pos;
        match (trace, &self.router_trace) {
            (Some(t), Some(rt)) => {
                let n = t.len();
                let h = self.run_layers(ids, state, Some(&mut *t))?;
                rt.write(first_pos, &t[n..])?;
                Ok(h)
            }
            (None, Some(rt)) => {
                let mut local = RouteTrace::new();
                let h = self.run_layers(ids, state, Some(&mut local))?;
                rt.write(first_pos, &local)?;
                Ok(h)
            }
            (t, None) => self.run_layers(ids, state, t),
        }
    }

    /// One pass of all layers over `ids`; returns the tail AttnRes output `[T, H]`.
    fn run_layers(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        mut trace: Option<&mut RouteTrace>,
    ) -> Result<Tensor> {
        let t = self.cfg.text();
        let eps = t.rms_norm_eps;
        self.experts.begin_token();
        let mut pass = self.spine.pass();
        let mut h = self.spine.embed_rows(ids)?;
        let mut anchors: Vec<Tensor> = Vec::new();
        let prof = self.layer_profile.as_deref();
        let wait_s = |on: bool| -> f64 {
            if on {
                self.experts.stats().map(|s| s.read_wait_s).unwrap_or(0.0)
            } else {
                0.0
            }
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let mut clock = std::time::Instant::now();
            let mut tm = [0f64; 5]; // spine wait, attention, ffn, expert wait, other
            let ld = pass.layer(l)?;
            tm[0] = lap(&mut clock);
            let a_in = if anchors.is_empty() {
                h.clone()
            } else {
                let mut v: Vec<&Tensor> = anchors.iter().collect();
                v.push(&h);
                layer.attn_res.forward(&v)?
            };
            let prefix = if l % t.attn_res_block_size == 0 {
                anchors.push(h.clone());
                None
            } else {
                Some(h.clone())
            };
            let x = rms_norm(&a_in, &layer.input_norm, eps)?;
            tm[4] += lap(&mut clock);
            let o = self.attention(l, &x, state, &ld)?;
            if prof.is_some() {
                // Candle ops may be queued on a GPU: time the work, not its submission.
                o.device().synchronize()?;
            }
            tm[1] = lap(&mut clock);
            let p = match prefix {
                Some(pr) => (pr + o)?,
                None => o,
            };
            let mut v: Vec<&Tensor> = anchors.iter().collect();
            v.push(&p);
            let m_in = layer.mlp_res.forward(&v)?;
            let xm = rms_norm(&m_in, &layer.post_norm, eps)?;
            tm[4] += lap(&mut clock);
            let waited = wait_s(prof.is_some());
            let om = match &layer.ffn {
                Ffn::Dense(mlp) => mlp.forward(&xm, &ld)?,
                Ffn::Moe(moe) => {
                    let mut routes = Vec::new();
                    let y = moe.forward(
                        &xm,
                        &ld,
                        self.experts.as_ref(),
                        self.options.kernel,
                        self.options.expert_batch,
                        trace.as_ref().map(|_| &mut routes),
                    )?;
                    if let Some(tr) = trace.as_deref_mut() {
                        tr.push((l, routes));
                    }
                    y
                }
            };
            if prof.is_some() {
                om.device().synchronize()?;
                tm[2] = lap(&mut clock);
                tm[3] = (wait_s(true) - waited) * 1e3;
            }
            h = (p + om)?;
            if let Some(pf) = prof {
                h.device().synchronize()?;
                tm[4] += lap(&mut clock);
                pf.push(LayerTiming {
                    layer: l,
                    attn: match layer.attn {
                        Attn::Kda(_) => "kda",
                        Attn::Mla(_) => "mla",
                    },
                    ffn: match layer.ffn {
                        Ffn::Dense(_) => "dense",
                        Ffn::Moe(_) => "moe",
                    },
                    tokens: ids.len(),
                    spine_wait_ms: tm[0],
                    attn_ms: tm[1],
                    ffn_ms: tm[2],
                    expert_wait_ms: tm[3],
                    other_ms: tm[4],
                });
            }
        }
        state.pos += ids.len();
        let mut v: Vec<&Tensor> = anchors.iter().collect();
        v.push(&h);
        Ok(self.out_res.forward(&v)?)
    }
}
