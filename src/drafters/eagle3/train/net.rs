//! The EAGLE-3 head as a Candle autograd network, for training: the same function as
//! `eagle3::head` (SpecForge's spelling: the residual is the incoming row, the logits come from
//! the final norm, the row fed back is the one before it), written with differentiable tensor
//! ops over `Var`s, and unrolled over several draft steps as EAGLE-3's "training-time test":
//! step `j` of the chain anchored at position `t` sits at position `t + j`, reads the step
//! before's own row and the embedding of token `t + j + 1`, and attends to the anchor's
//! context (step 0's keys at positions `≤ t`) and to its own chain's keys of steps `1..=j`:
//! exactly what the drafter's cache holds when it drafts. Owns the parameters and the
//! unrolled forward; the data and the loop are `super::{data, run}`.

use std::collections::BTreeMap;

use candle::{DType, Device, Tensor, Var, D};

use crate::Result;

/// The head's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeadDims {
    /// The head's hidden size (`H`).
    pub hidden: usize,
    /// The target's hidden size (`Ht`).
    pub target_hidden: usize,
    /// Attention heads (also the key/value heads).
    pub heads: usize,
    /// Values per attention head.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// The target's vocabulary.
    pub vocab: usize,
    /// The draft vocabulary.
    pub draft_vocab: usize,
}

/// RMSNorm epsilon of the exported head.
pub const EPS: f64 = 1e-5;
/// Rotary base of the exported head.
pub const ROPE_THETA: f64 = 10_000.0;

/// A batch, `B` windows of `T` positions each.
pub struct Batch {
    /// The target's three tapped rows per position, concatenated `[B, T, 3·Ht]`.
    pub taps: Tensor,
    /// Every token of the window and the `steps + 1` after it `[B, T + steps + 1]` (u32):
    /// step `j` at anchor `t` embeds token `t + j + 1` and predicts draft id of token `t + j + 2`.
    pub ids: Vec<Vec<u32>>,
    /// Per step, the draft-vocabulary label of each anchor `[B·T]` (u32), and its weight
    /// `[B·T]` (f32, 0 where the label is not the target's greedy choice or not in the draft
    /// vocabulary).
    pub labels: Vec<(Tensor, Tensor)>,
}

/// The head's parameters, by their exported (SpecForge) names.
pub struct HeadNet {
    /// The shape.
    pub dims: HeadDims,
    /// Every trained tensor.
    pub vars: BTreeMap<String, Var>,
}

fn linear(x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    x.broadcast_matmul(&w.t()?)
}

fn rms_norm(x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + EPS)?.sqrt()?)?.broadcast_mul(w)
}

/// NeoX rotary (pairs half a head apart) at `positions`, over `[B, T, nh, hd]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle::Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let (a, b) = (x.narrow(3, 0, hd / 2)?, x.narrow(3, hd / 2, hd / 2)?);
    let rot = Tensor::cat(&[&b.neg()?, &a], 3)?;
    x.broadcast_mul(cos)?.add(&rot.broadcast_mul(sin)?)
}

/// `cos`/`sin` tables `[1, T, 1, hd]` for positions `offset..offset + t`.
fn rope_tables(t: usize, offset: usize, hd: usize, dev: &Device) -> Result<(Tensor, Tensor)> {
    let half = hd / 2;
    let (mut c, mut s) = (Vec::with_capacity(t * hd), Vec::with_capacity(t * hd));
    for p in offset..offset + t {
        for i in 0..hd {
            let f = 1.0 / (ROPE_THETA as f32).powf((2 * (i % half)) as f32 / hd as f32);
            let a = p as f32 * f;
            c.push(a.cos());
            s.push(a.sin());
        }
    }
    Ok((
        Tensor::from_vec(c, (1, t, 1, hd), dev)?,
        Tensor::from_vec(s, (1, t, 1, hd), dev)?,
    ))
}

/// One step's keys and values `[B, nh, T, hd]`, and its queries.
struct Qkv {
    q: Tensor,
    k: Tensor,
    v: Tensor,
}

impl HeadNet {
    /// Freshly initialised (seeded): normal weights scaled by fan-in, unit norms.
    pub fn init(dims: HeadDims, seed: u64, dev: &Device) -> Result<Self> {
        let d = dims;
        let (h, qd) = (d.hidden, d.heads * d.head_dim);
        let shapes: Vec<(&str, Vec<usize>)> = vec![
            ("embed_tokens.weight", vec![d.vocab, h]),
            ("fc.weight", vec![h, 3 * d.target_hidden]),
            ("midlayer.input_layernorm.weight", vec![h]),
            ("midlayer.hidden_norm.weight", vec![h]),
            ("midlayer.self_attn.q_proj.weight", vec![qd, 2 * h]),
            ("midlayer.self_attn.k_proj.weight", vec![qd, 2 * h]),
            ("midlayer.self_attn.v_proj.weight", vec![qd, 2 * h]),
            ("midlayer.self_attn.o_proj.weight", vec![h, qd]),
            ("midlayer.post_attention_layernorm.weight", vec![h]),
            ("midlayer.mlp.gate_proj.weight", vec![d.intermediate, h]),
            ("midlayer.mlp.up_proj.weight", vec![d.intermediate, h]),
            ("midlayer.mlp.down_proj.weight", vec![h, d.intermediate]),
            ("norm.weight", vec![h]),
            ("lm_head.weight", vec![d.draft_vocab, h]),
        ];
        let mut rng = crate::checkpoint::rng::Rng::new(seed);
        let mut vars = BTreeMap::new();
        for (name, shape) in shapes {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if shape.len() == 1 {
                vec![1.0; n]
            } else {
                let scale = if name.starts_with("embed") {
                    1.0
                } else {
                    (shape[1] as f32).powf(-0.5)
                };
                (0..n).map(|_| rng.normal() as f32 * scale).collect()
            };
            let t = Tensor::from_vec(values, shape, dev)?;
            vars.insert(name.to_string(), Var::from_tensor(&t)?);
        }
        Ok(HeadNet { dims, vars })
    }

    /// A parameter.
    pub fn p(&self, name: &str) -> Result<&Tensor> {
        self.vars
            .get(name)
            .map(|v| v.as_tensor())
            .ok_or_else(|| crate::Error::Msg(format!("no parameter {name}")))
    }

    /// Every trained tensor.
    pub fn all_vars(&self) -> Vec<Var> {
        self.vars.values().cloned().collect()
    }

    fn qkv(&self, e: &Tensor, x: &Tensor, offset: usize) -> Result<Qkv> {
        let (b, t, _) = x.dims3()?;
        let (nh, hd) = (self.dims.heads, self.dims.head_dim);
        let a = |s: &str| self.p(&format!("midlayer.{s}"));
        let cat = Tensor::cat(
            &[
                &rms_norm(e, a("input_layernorm.weight")?)?,
                &rms_norm(x, a("hidden_norm.weight")?)?,
            ],
            2,
        )?;
        let (cos, sin) = rope_tables(t, offset, hd, x.device())?;
        let split =
            |w: &str| -> Result<Tensor> { Ok(linear(&cat, a(w)?)?.reshape((b, t, nh, hd))?) };
        let q = rope(&split("self_attn.q_proj.weight")?, &cos, &sin)?;
        let k = rope(&split("self_attn.k_proj.weight")?, &cos, &sin)?;
        let v = split("self_attn.v_proj.weight")?;
        let heads_first = |x: Tensor| x.transpose(1, 2)?.contiguous();
        Ok(Qkv {
            q: heads_first(q)?,
            k: heads_first(k)?,
            v: heads_first(v)?,
        })
    }

    /// The layer after attention: the residual, `o_proj`, the MLP; returns the row and logits.
    fn finish(&self, x: &Tensor, attn: &Tensor) -> Result<(Tensor, Tensor)> {
        let (b, nh, t, hd) = attn.dims4()?;
        let a = |s: &str| self.p(&format!("midlayer.{s}"));
        let o = attn.transpose(1, 2)?.reshape((b, t, nh * hd))?;
        let h1 = (x + linear(&o, a("self_attn.o_proj.weight")?)?)?;
        let m = rms_norm(&h1, a("post_attention_layernorm.weight")?)?;
        let g = linear(&m, a("mlp.gate_proj.weight")?)?;
        let silu = g.mul(&(g.neg()?.exp()? + 1.0)?.recip()?)?;
        let u = linear(&m, a("mlp.up_proj.weight")?)?;
        let out = (&h1 + linear(&silu.mul(&u)?, a("mlp.down_proj.weight")?)?)?;
        let logits = linear(
            &rms_norm(&out, self.p("norm.weight")?)?,
            self.p("lm_head.weight")?,
        )?;
        Ok((out, logits))
    }

    fn embed(&self, ids: &[Vec<u32>], from: usize, t: usize) -> Result<Tensor> {
        let flat: Vec<u32> = ids
            .iter()
            .flat_map(|w| w[from..from + t].to_vec())
            .collect();
        let dev = self.p("fc.weight")?.device().clone();
        let idx = Tensor::from_vec(flat, ids.len() * t, &dev)?;
        let h = self.dims.hidden;
        Ok(self
            .p("embed_tokens.weight")?
            .index_select(&idx, 0)?
            .reshape((ids.len(), t, h))?)
    }

    /// The logits `[B, T, Vd]` of steps `0..steps` over a batch, unrolled as the drafter runs
    /// them (see the module header).
    pub fn forward(&self, batch: &Batch, steps: usize) -> Result<Vec<Tensor>> {
        let t = batch.taps.dim(1)?;
        let hd = self.dims.head_dim;
        let scale = (hd as f64).powf(-0.5);
        let x0 = linear(&batch.taps, self.p("fc.weight")?)?;
        let base = self.qkv(&self.embed(&batch.ids, 1, t)?, &x0, 0)?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), x0.device())?;
        let mut out = Vec::with_capacity(steps);
        let (mut x, mut cur) = (x0, base.q.clone());
        // The chain's own keys and values of steps 1..=j.
        let mut own: Vec<(Tensor, Tensor)> = Vec::new();
        for j in 0..steps {
            let ctx = (cur.matmul(&base.k.t()?)? * scale)?.broadcast_add(&mask)?;
            let diag: Vec<Tensor> = own
                .iter()
                .map(|(k, _)| Ok((cur.mul(k)?.sum_keepdim(D::Minus1)? * scale)?))
                .collect::<Result<_>>()?;
            let mut all = vec![ctx];
            all.extend(diag);
            let p = candle_nn::ops::softmax(&Tensor::cat(&all, 3)?, D::Minus1)?;
            let mut attn = p.narrow(3, 0, t)?.matmul(&base.v)?;
            for (i, (_, v)) in own.iter().enumerate() {
                attn = (attn + p.narrow(3, t + i, 1)?.broadcast_mul(v)?)?;
            }
            let (row, logits) = self.finish(&x, &attn)?;
            out.push(logits);
            if j + 1 == steps {
                break;
            }
            // Step j + 1 at position t + j + 1: its own row, the next token's embedding.
            let next = self.qkv(&self.embed(&batch.ids, j + 2, t)?, &row, j + 1)?;
            // Positions shift by one per step: the rope offset is the same for every anchor.
            own.push((next.k.clone(), next.v.clone()));
            cur = next.q;
            x = row;
        }
        Ok(out)
    }

    /// The weighted cross-entropy of `forward`'s logits against the batch's labels, step `j`
    /// weighted `0.8^j` (EAGLE-3's decay); also each step's accuracy on weighted anchors.
    pub fn loss(&self, batch: &Batch, steps: usize) -> Result<(Tensor, Vec<f64>)> {
        let logits = self.forward(batch, steps)?;
        let mut total: Option<Tensor> = None;
        let mut acc = Vec::with_capacity(steps);
        for (j, l) in logits.iter().enumerate() {
            let (labels, w) = &batch.labels[j];
            let l = l.flatten_to(1)?;
            let lsm = candle_nn::ops::log_softmax(&l, D::Minus1)?;
            let picked = lsm.gather(&labels.unsqueeze(1)?, 1)?.squeeze(1)?;
            let n = w.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64;
            let ce = ((picked.mul(w)?.sum_all()?.neg()? / n)? * 0.8f64.powi(j as i32))?;
            total = Some(match total {
                Some(t) => (t + ce)?,
                None => ce,
            });
            let hit = l
                .argmax(D::Minus1)?
                .eq(labels)?
                .to_dtype(DType::F32)?
                .mul(w)?
                .sum_all()?
                .to_scalar::<f32>()? as f64;
            acc.push(hit / n);
        }
        let total = total.ok_or_else(|| crate::Error::Msg("no draft steps to train".into()))?;
        Ok((total, acc))
    }
}
