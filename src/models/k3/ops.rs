//! Primitive ops in the reference operation order (spec §3.1), as Candle ops on f32.

use candle::{Tensor, D};

/// `w ⊙ (x · rsqrt(mean(x²) + eps))` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    let inv = (ms + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(w)
}

/// RMS normalisation without a weight.
pub fn rms_normalize(x: &Tensor, eps: f64) -> candle::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_mul(&(ms + eps)?.sqrt()?.recip()?)
}

/// Epsilon of KDA's q/k L2 norm, inside the square root (fla's in-kernel norm, spec §3.4).
pub const KDA_QK_L2_EPS: f32 = 1e-6;

/// Epsilon of MLA's two latent RMSNorms (`q_a_layernorm`, `kv_a_layernorm`): Moonshot builds
/// them without passing `rms_norm_eps`, so they keep KimiRMSNorm's default (spec §1.2, §3.5).
pub const MLA_LATENT_NORM_EPS: f64 = 1e-6;

/// KDA's q/k normalisation over each `d`-wide head vector, in place: `x · rsqrt(Σx² + ε)`, and
/// q then scaled by `1/sqrt(d)` (fla's `use_qk_l2norm_in_kernel`, spec §3.4).
pub fn l2_normalize_qk(q: &mut [f32], k: &mut [f32], d: usize) {
    let qscale = 1.0 / (d as f32).sqrt();
    for (hq, hk) in q.chunks_mut(d).zip(k.chunks_mut(d)) {
        let rq = 1.0 / (hq.iter().map(|x| x * x).sum::<f32>() + KDA_QK_L2_EPS).sqrt();
        hq.iter_mut().for_each(|x| *x = *x * rq * qscale);
        let rk = 1.0 / (hk.iter().map(|x| x * x).sum::<f32>() + KDA_QK_L2_EPS).sqrt();
        hk.iter_mut().for_each(|x| *x *= rk);
    }
}

/// Logistic sigmoid.
pub fn sigmoid(x: &Tensor) -> candle::Result<Tensor> {
    candle_nn::ops::sigmoid(x)
}

/// SiTU: `((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin)`.
pub fn situ(g: &Tensor, u: &Tensor, beta: f64, linear_beta: f64) -> candle::Result<Tensor> {
    let gate = ((g / beta)?.tanh()? * beta)?.mul(&sigmoid(g)?)?;
    let up = ((u / linear_beta)?.tanh()? * linear_beta)?;
    gate.mul(&up)
}
