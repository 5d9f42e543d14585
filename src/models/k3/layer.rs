//! One decoder layer (spec §3.3): Block Attention Residuals before attention and before the
//! feed-forward, KDA or MLA attention, a dense MLP or a latent MoE. `Layer::forward` is the whole
//! layer on one layer-major pass (its rows held as prefill chunks) with that pass's data; it reports its progress to an `Observer` and holds no clock, trace or
//! device sync of its own. Owns the layer's small tensors and bound slots, never its state.

use candle::Tensor;

use super::attn_res::AttnRes;
use super::kda::Kda;
use super::mla::Mla;
use super::moe::{Mlp, Moe};
use super::ops::rms_norm;
use super::options::ModelOptions;
use super::weights::LayerWeights;
use crate::experts::ExpertProvider;
use crate::models::k3::config::{AttnKind, FfnKind, LayerKind};
use crate::runtime::observe::{Event, Observer, Rows};
use crate::runtime::rollback::LayerUndo;
use crate::runtime::state::LayerState;
use crate::spine::layer::LayerData;
use crate::Result;

enum Attn {
    Kda(Box<Kda>),
    Mla(Box<Mla>),
}

enum Ffn {
    Dense(Mlp),
    Moe(Box<Moe>),
}

/// One decoder layer.
pub(super) struct Layer {
    attn_res: AttnRes,
    mlp_res: AttnRes,
    input_norm: Tensor,
    post_norm: Tensor,
    attn: Attn,
    ffn: Ffn,
}

/// What every layer of a pass shares.
pub(super) struct PassCtx<'a> {
    /// Layers per AttnRes block (a block boundary starts a new anchor).
    pub block_size: usize,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// Evaluation options.
    pub options: &'a ModelOptions,
    /// The routed experts.
    pub experts: &'a dyn ExpertProvider,
    /// Who watches.
    pub observer: &'a dyn Observer,
}

impl Layer {
    /// Loads layer `w.layer` of kind `kind`.
    pub fn load(w: &LayerWeights, kind: &LayerKind) -> Result<Self> {
        let t = w.cfg.text();
        let (h, eps) = (t.hidden_size, t.rms_norm_eps);
        let res = |n: &str, p: &str| -> Result<AttnRes> {
            Ok(AttnRes::new(&w.get(n, &[h])?, &w.get(p, &[1, h])?, eps)?)
        };
        Ok(Layer {
            attn_res: res(
                "self_attention_res_norm.weight",
                "self_attention_res_proj.weight",
            )?,
            mlp_res: res("mlp_res_norm.weight", "mlp_res_proj.weight")?,
            input_norm: w.get("input_layernorm.weight", &[h])?,
            post_norm: w.get("post_attention_layernorm.weight", &[h])?,
            attn: match kind.attn {
                AttnKind::Kda => Attn::Kda(Box::new(Kda::load(w)?)),
                AttnKind::Mla => Attn::Mla(Box::new(Mla::load(w)?)),
            },
            ffn: match kind.ffn {
                FfnKind::Dense => Ffn::Dense(Mlp::load(w, "mlp", t.intermediate_size)?),
                FfnKind::Moe => Ffn::Moe(Box::new(Moe::load(w)?)),
            },
        })
    }

    /// `(attention, feed-forward)` kinds' labels (`kda`/`mla`, `dense`/`moe`), for reports.
    pub fn kinds(&self) -> (&'static str, &'static str) {
        let a = match self.attn {
            Attn::Kda(_) => AttnKind::Kda,
            Attn::Mla(_) => AttnKind::Mla,
        };
        let f = match self.ffn {
            Ffn::Dense(_) => FfnKind::Dense,
            Ffn::Moe(_) => FfnKind::Moe,
        };
        (a.label(), f.label())
    }

    /// A fresh attention state for this layer with room for `context` positions.
    pub fn new_state(&self, context: usize) -> LayerState {
        match &self.attn {
            Attn::Kda(k) => LayerState::Recurrent(k.new_state()),
            Attn::Mla(m) => LayerState::Rows(m.new_state(context)),
        }
    }

    /// Attention alone on the normalised input `x` `[T, H]`; with `undo` (a verify pass) it
    /// also records what keeping a prefix of the rows needs.
    pub fn attention(
        &self,
        x: &Tensor,
        state: &mut LayerState,
        options: &ModelOptions,
        ld: &LayerData,
        undo: Option<&mut Vec<LayerUndo>>,
    ) -> Result<Tensor> {
        match (&self.attn, state) {
            (Attn::Kda(k), LayerState::Recurrent(s)) => match undo {
                Some(u) => {
                    let mut rec = Box::<super::verify::KdaUndo>::default();
                    let o = k.forward(x, s, options.kda, ld, Some(&mut rec))?;
                    u.push(LayerUndo::Recurrent(rec));
                    Ok(o)
                }
                None => k.forward(x, s, options.kda, ld, None),
            },
            (Attn::Mla(m), LayerState::Rows(s)) => {
                if let Some(u) = undo {
                    u.push(LayerUndo::Rows(s.len()));
                }
                m.forward(x, s, options.mla, ld)
            }
            _ => Err(crate::Error::Msg(
                "the sequence state does not match the layer kind".into(),
            )),
        }
    }

    /// Layer `l` on a layer-major pass whose hidden state `h` is held as its prefill chunks
    /// (`[rows, H]` each): returns the new hidden state, chunk by chunk. Every row-wise op
    /// runs on one chunk at a time (the activations a chunk needs, as the chunk-major order
    /// had), attention consumes each chunk with the state of the sequence `owner[c]` of
    /// `seqs` (a batched pass holds chunks of several sequences; a sequence's chunks come in
    /// order), and the MoE reads each selected expert once for the whole pass. `anchors` are
    /// the AttnRes block outputs so far, one chunk list each (this layer adds one at a block
    /// boundary); a sequence's `undo` (a verify pass, one chunk): see `attention`. Events show
    /// the pass's last chunk.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        l: usize,
        h: Vec<Tensor>,
        anchors: &mut Vec<Vec<Tensor>>,
        seqs: &mut [SeqLayer<'_>],
        owner: &[usize],
        ld: &LayerData,
        cx: &PassCtx,
    ) -> Result<Vec<Tensor>> {
        let obs = cx.observer;
        if owner.len() != h.len() || owner.iter().any(|&o| o >= seqs.len()) {
            return Err(crate::Error::Msg(
                "every chunk of a pass needs a sequence".into(),
            ));
        }
        let block = l.is_multiple_of(cx.block_size);
        let n = h.len();
        let (mut new_anchor, mut ps, mut xs) =
            (Vec::new(), Vec::with_capacity(n), Vec::with_capacity(n));
        let mut last_o = None;
        obs.on(l, &Event::AttentionIn);
        for (c, hc) in h.into_iter().enumerate() {
            let mut mix = column(anchors, c);
            let a_in = if mix.is_empty() {
                hc.clone()
            } else {
                self.attn_res.forward(&with(&mix, &hc))?
            };
            let prefix = if block {
                new_anchor.push(hc);
                None
            } else {
                Some(hc)
            };
            let x = rms_norm(&a_in, &self.input_norm, cx.eps)?;
            let seq = &mut seqs[owner[c]];
            let o = self.attention(&x, seq.state, cx.options, ld, seq.undo.as_deref_mut())?;
            let p = match prefix {
                Some(pr) => (pr + &o)?,
                None => o.clone(),
            };
            if block {
                mix.push(&new_anchor[c]);
            }
            let m_in = self.mlp_res.forward(&with(&mix, &p))?;
            xs.push(rms_norm(&m_in, &self.post_norm, cx.eps)?);
            ps.push(p);
            last_o = Some(o);
        }
        if block {
            anchors.push(new_anchor);
        }
        if let Some(o) = &last_o {
            obs.on(l, &Event::Attention(o));
        }
        obs.on(l, &Event::FfnIn);
        let oms = match &self.ffn {
            Ffn::Dense(mlp) => xs
                .iter()
                .map(|x| mlp.forward(x, ld))
                .collect::<Result<Vec<_>>>()?,
            Ffn::Moe(moe) => {
                let (ys, routes) = moe.forward_chunks(xs, ld, cx.experts, cx.options)?;
                obs.on(l, &Event::Routes(&routes));
                ys
            }
        };
        if let Some(om) = oms.last() {
            obs.on(l, &Event::Ffn(om));
        }
        let h = ps
            .into_iter()
            .zip(oms)
            .map(|(p, om)| p + om)
            .collect::<candle::Result<Vec<_>>>()?;
        // Every chunk's rows, in order (a long prefill or a batch holds several chunks).
        match h.as_slice() {
            [] => {}
            [one] => obs.on(l, &Event::LayerDone(Rows::Tensor(one))),
            all => obs.on(l, &Event::LayerDone(Rows::Tensor(&Tensor::cat(all, 0)?))),
        }
        Ok(h)
    }
}

/// One sequence's part of a layer in a pass: its state and, for a verify pass, its undo record.
pub(super) struct SeqLayer<'a> {
    /// The sequence's state of this layer.
    pub state: &'a mut LayerState,
    /// The verify pass's record (one chunk), else `None`.
    pub undo: Option<&'a mut Vec<LayerUndo>>,
}

/// Chunk `c` of every anchor.
pub(super) fn column(anchors: &[Vec<Tensor>], c: usize) -> Vec<&Tensor> {
    anchors.iter().filter_map(|a| a.get(c)).collect()
}

/// The anchors followed by `x`: what AttnRes mixes.
pub(super) fn with<'a>(anchors: &[&'a Tensor], x: &'a Tensor) -> Vec<&'a Tensor> {
    let mut v = anchors.to_vec();
    v.push(x);
    v
}
