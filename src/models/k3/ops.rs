//! Primitive ops in the reference operation order (spec §3.1), as Candle ops on f32. Sums over
//! the last dimension run in one fixed order on the CPU (`sum_last_keepdim`): candle's CPU sum
//! adds AVX lanes on x86-64 and NEON lanes on ARM64, and the two then differ in the last bits,
//! which `--kernel fast`'s int8 expert inputs can turn into a whole rounding step; `tanh` is
//! the routed experts' one for the same reason.

use candle::{DType, Tensor, D};

use crate::kernels::dense::{tree, LANES};

/// `w ⊙ (x · rsqrt(mean(x²) + eps))` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle::Result<Tensor> {
    x.broadcast_mul(&inv_rms(x, eps)?)?.broadcast_mul(w)
}

/// RMS normalisation without a weight.
pub fn rms_normalize(x: &Tensor, eps: f64) -> candle::Result<Tensor> {
    x.broadcast_mul(&inv_rms(x, eps)?)
}

/// `rsqrt(mean(x²) + eps)` over the last dimension, kept as a dimension of 1.
fn inv_rms(x: &Tensor, eps: f64) -> candle::Result<Tensor> {
    let n = x.dim(D::Minus1)?.max(1);
    let ms = (sum_last_keepdim(&x.sqr()?)? * (1.0 / n as f64))?;
    (ms + eps)?.sqrt()?.recip()
}

/// `Σ` over the last dimension, kept as a dimension of 1: on the CPU in 16 lanes and the fixed
/// tree of the dense kernels, the same bits on x86-64 and ARM64; elsewhere candle's sum.
pub fn sum_last_keepdim(x: &Tensor) -> candle::Result<Tensor> {
    let n = x.dim(D::Minus1)?;
    if !x.device().is_cpu() || x.dtype() != DType::F32 || n == 0 {
        return x.sum_keepdim(D::Minus1);
    }
    let values = x.flatten_all()?.to_vec1::<f32>()?;
    let sums: Vec<f32> = values.chunks_exact(n).map(fixed_sum).collect();
    let mut dims = x.dims().to_vec();
    if let Some(last) = dims.last_mut() {
        *last = 1;
    }
    Tensor::from_vec(sums, dims, x.device())
}

/// `Σ x`: element `i` into lane `i mod 16`, then the lanes' pairwise tree.
fn fixed_sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += v;
    }
    tree(&acc)
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
    let gate = (tanh(&(g / beta)?)? * beta)?.mul(&sigmoid(g)?)?;
    let up = (tanh(&(u / linear_beta)?)? * linear_beta)?;
    gate.mul(&up)
}

/// Element-wise `tanh`: on the CPU the routed experts' (`mxfp4::expert::tanh`, the same bits on
/// x86-64 and ARM64 with glibc), elsewhere candle's.
fn tanh(x: &Tensor) -> candle::Result<Tensor> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 {
        return x.tanh();
    }
    let values: Vec<f32> = x.flatten_all()?.to_vec1::<f32>()?;
    let y = values.into_iter().map(crate::mxfp4::expert::tanh).collect();
    Tensor::from_vec(y, x.shape(), x.device())
}
