//! Kimi Delta Attention (spec §3.4): projections and the output path as Candle ops; the short
//! causal conv, gate preparation and the gated delta rule on host slices.

use std::sync::Arc;

use candle::Tensor;

use super::kda_kernels::{self, KdaDims, KdaInputs};
use super::ops::{l2_normalize_qk, rms_norm, sigmoid};
use super::verify::KdaUndo;
use super::weights::LayerWeights;
use crate::compute::dense;
use crate::runtime::state::Recurrent;
use crate::spine::layer::LayerData;
use crate::spine::slot::Slot;
use crate::Result;

/// How the recurrence is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdaMode {
    /// One position at a time (the exactness reference).
    Recurrent,
    /// Chunks of this many positions (spec §3.4 chunk form).
    Chunked(usize),
}

/// A KDA layer's per-sequence state is the runtime's `Recurrent` with two buffers (shared
/// copy-on-write): this one, the last `W−1` raw projected inputs of q, k, v `[3, W−1, P]`...
pub const CONV: usize = 0;
/// ...and this one, the recurrent matrix `[H, K, V]`.
pub const S: usize = 1;

/// One KDA attention block.
#[derive(Debug)]
pub struct Kda {
    o_norm: Tensor,
    conv_w: [Vec<f32>; 3],
    /// `exp(A_log[h])`, one per head (spec §3.4: `A_log` is per head; entries past `heads`
    /// are the checkpoint's zero padding and are not read).
    a_exp: Vec<f32>,
    dt_bias: Vec<f32>,
    heads: usize,
    d: usize,
    width: usize,
    lower_bound: f32,
    eps: f64,
    /// `q, k, v, f_a, f_b, b, g, o` projections.
    m: KdaMatrices,
}

/// The KDA projections, bound at load.
#[derive(Debug)]
struct KdaMatrices {
    q: Slot,
    k: Slot,
    v: Slot,
    f_a: Slot,
    f_b: Slot,
    b: Slot,
    g: Slot,
    o: Slot,
}

impl Kda {
    /// Loads layer weights (`self_attn.*`).
    pub fn load(w: &LayerWeights) -> Result<Self> {
        let c = w.cfg.text();
        let la = &c.linear_attn_config;
        let (h, hk, d, cw) = (
            c.hidden_size,
            la.num_heads,
            la.head_dim,
            la.short_conv_kernel_size,
        );
        let p = hk * d;
        let host = |n: &str, shape: &[usize]| w.values(n, shape);
        let a_log = w.a_log(hk)?;
        Ok(Kda {
            o_norm: w.get("self_attn.o_norm.weight", &[d])?,
            conv_w: [
                host("self_attn.q_conv1d.weight", &[p, 1, cw])?,
                host("self_attn.k_conv1d.weight", &[p, 1, cw])?,
                host("self_attn.v_conv1d.weight", &[p, 1, cw])?,
            ],
            a_exp: a_log.iter().map(|a| a.exp()).collect(),
            dt_bias: host("self_attn.dt_bias", &[p])?,
            heads: hk,
            d,
            width: cw,
            lower_bound: la.gate_lower_bound as f32,
            eps: c.rms_norm_eps,
            m: KdaMatrices {
                q: w.slot("self_attn.q_proj.weight", p, h)?,
                k: w.slot("self_attn.k_proj.weight", p, h)?,
                v: w.slot("self_attn.v_proj.weight", p, h)?,
                f_a: w.slot("self_attn.f_a_proj.weight", d, h)?,
                f_b: w.slot("self_attn.f_b_proj.weight", p, d)?,
                b: w.slot("self_attn.b_proj.weight", hk, h)?,
                g: w.slot("self_attn.g_proj.weight", p, h)?,
                o: w.slot("self_attn.o_proj.weight", h, p)?,
            },
        })
    }

    /// A zero state.
    pub fn new_state(&self) -> Recurrent {
        let p = self.heads * self.d;
        Recurrent::zeros(&[3 * (self.width - 1) * p, self.heads * self.d * self.d])
    }

    /// Causal depthwise conv + SiLU over `[history, x_1..x_T]`; updates the history.
    fn conv(&self, which: usize, xp: &[f32], t: usize, hist: &mut [f32]) -> Vec<f32> {
        let p = self.heads * self.d;
        let wn = self.width;
        let w = &self.conv_w[which];
        // src rows: W−1 history rows then T new rows.
        let mut src = Vec::with_capacity((wn - 1 + t) * p);
        src.extend_from_slice(hist);
        src.extend_from_slice(xp);
        let mut y = vec![0f32; t * p];
        for tt in 0..t {
            for c in 0..p {
                let mut acc = 0f32;
                for j in 0..wn {
                    acc += w[c * wn + j] * src[(tt + j) * p + c];
                }
                y[tt * p + c] = acc / (1.0 + (-acc).exp());
            }
        }
        hist.copy_from_slice(&src[t * p..]);
        y
    }

    /// The decay gate `g [T, heads, d]` from `graw [T, P]`: head `h` scales all its channels by
    /// `exp(A_log[h])` (per head, as mlx-lm, fla and Moonshot's module read it).
    fn gate(&self, graw: &[f32]) -> Vec<f32> {
        let p = self.heads * self.d;
        graw.iter()
            .enumerate()
            .map(|(i, gr)| {
                let c = i % p;
                let a = self.a_exp[c / self.d] * (gr + self.dt_bias[c]);
                self.lower_bound * (1.0 / (1.0 + (-a).exp()))
            })
            .collect()
    }

    /// `x` is the normalised layer input `[T, H]`; returns `[T, H]`. With `undo` (a verify
    /// pass) the recurrence runs per position, the state keeps only the first position and
    /// `undo` records what replaying the others needs (`super::verify`).
    pub fn forward(
        &self,
        x: &Tensor,
        st: &mut Recurrent,
        mode: KdaMode,
        ld: &LayerData,
        undo: Option<&mut KdaUndo>,
    ) -> Result<Tensor> {
        let t = x.dim(0)?;
        let (hk, d) = (self.heads, self.d);
        let p = hk * d;
        let (m, w) = (|s: &Slot| ld.matrix_at(s), &self.m);
        let host = |t: Tensor| -> Result<Vec<f32>> { Ok(t.flatten_all()?.to_vec1::<f32>()?) };
        let qp = host(dense(x, &m(&w.q)?)?)?; // [T, P]
        let kp = host(dense(x, &m(&w.k)?)?)?;
        let vp = host(dense(x, &m(&w.v)?)?)?;
        let fa = dense(x, &m(&w.f_a)?)?; // [T, d]
        let graw = host(dense(&fa, &m(&w.f_b)?)?)?;
        let braw = host(dense(x, &m(&w.b)?)?)?; // [T, heads]
        let gout = dense(x, &m(&w.g)?)?;

        let conv = Arc::make_mut(&mut st.buffers[CONV]);
        let hl = (self.width - 1) * p;
        let mut undo = undo;
        if let Some(u) = undo.as_deref_mut() {
            *u = KdaUndo {
                heads: hk,
                d,
                width: self.width,
                hist: conv.to_vec(),
                raw: [qp.clone(), kp.clone(), vp.clone()],
                ..KdaUndo::default()
            };
        }
        let mut q = self.conv(0, &qp, t, &mut conv[..hl]);
        let mut k = self.conv(1, &kp, t, &mut conv[hl..2 * hl]);
        let v = self.conv(2, &vp, t, &mut conv[2 * hl..]);
        l2_normalize_qk(&mut q, &mut k, d);
        let beta: Vec<f32> = braw.iter().map(|b| 1.0 / (1.0 + (-b).exp())).collect();
        let g = self.gate(&graw);
        let s = Arc::make_mut(&mut st.buffers[S]);
        let dims = KdaDims { t, h: hk, d };
        let inp = KdaInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
        };
        let o = match (mode, undo) {
            (_, Some(u)) => u.verify(inp, s, dims),
            (KdaMode::Chunked(c), None) if t > 1 => kda_kernels::chunked(inp, s, dims, c),
            _ => kda_kernels::recurrent(inp, s, dims),
        };
        let o = Tensor::from_vec(o, (t, hk, d), x.device())?; // [T, heads, d]
        let o = rms_norm(&o, &self.o_norm, self.eps)?;
        let o = o.mul(&sigmoid(&gout.reshape((t, hk, d))?)?)?; // [T, heads, d]
        dense(&o.reshape((t, p))?, &m(&w.o)?)
    }
}

/// A KDA layer whose stored `A_log` holds non-zero values past its first `num_heads` entries:
/// the reference ignores them (only the per-head values are read), so they point at a checkpoint
/// written under the per-channel misreading.
#[derive(Debug, Clone, PartialEq)]
pub struct ALogPadding {
    /// Layer index.
    pub layer: usize,
    /// Non-zero entries past `num_heads`.
    pub nonzero: usize,
    /// The largest of them in absolute value.
    pub max_abs: f32,
}

/// Reads every KDA layer's `A_log` from the checkpoint and returns the layers with non-zero
/// padding (what `doctor` reports).
pub fn a_log_padding(
    inv: &crate::checkpoint::Inventory,
    cfg: &crate::models::k3::config::K3Config,
) -> Result<Vec<ALogPadding>> {
    use crate::checkpoint::Dtype;
    use std::os::unix::fs::FileExt;
    let heads = cfg.text().linear_attn_config.num_heads;
    let mut out = Vec::new();
    for (layer, kind) in cfg.schedule.iter().enumerate() {
        if kind.attn != crate::models::k3::config::AttnKind::Kda {
            continue;
        }
        let name = inv.layer_name(layer, "self_attn.A_log");
        let info = inv.get(&name).ok_or_else(|| crate::Error::Tensor {
            name: name.clone(),
            msg: "missing from the checkpoint".into(),
        })?;
        let path = inv.shard_path(info.shard);
        let mut bytes = vec![0u8; info.len() as usize];
        std::fs::File::open(&path)
            .and_then(|f| f.read_exact_at(&mut bytes, info.start))
            .map_err(|e| crate::Error::io(&path, e))?;
        let values: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            d => {
                return Err(crate::Error::Tensor {
                    name,
                    msg: format!("dtype {d:?}, expected F32 or BF16"),
                })
            }
        };
        let pad = values.get(heads..).unwrap_or(&[]);
        let nonzero = pad.iter().filter(|v| **v != 0.0).count();
        if nonzero > 0 {
            let max_abs = pad.iter().fold(0f32, |m, v| m.max(v.abs()));
            out.push(ALogPadding {
                layer,
                nonzero,
                max_abs,
            });
        }
    }
    Ok(out)
}
