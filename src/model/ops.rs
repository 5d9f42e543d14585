//! Primitive ops in the reference operation order (spec §3.1), as Candle ops on f32.

use candle::{DType, Tensor, D};

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

/// Logistic sigmoid.
pub fn sigmoid(x: &Tensor) -> candle::Result<Tensor> {
    candle_nn::ops::sigmoid(x)
}

/// SiLU `x·σ(x)`.
pub fn silu(x: &Tensor) -> candle::Result<Tensor> {
    x * sigmoid(x)?
}

/// SiTU: `((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin)`.
pub fn situ(g: &Tensor, u: &Tensor, beta: f64, linear_beta: f64) -> candle::Result<Tensor> {
    let gate = ((g / beta)?.tanh()? * beta)?.mul(&sigmoid(g)?)?;
    let up = ((u / linear_beta)?.tanh()? * linear_beta)?;
    gate.mul(&up)
}

/// `x / max(‖x‖₂, 1e-12)` over the last dimension.
pub fn l2_normalize(x: &Tensor) -> candle::Result<Tensor> {
    let n = x.sqr()?.sum_keepdim(D::Minus1)?.sqrt()?.maximum(1e-12)?;
    x.broadcast_div(&n)
}

/// `x · Wᵀ` for `x` `[.., in]` and `W` `[out, in]` (f32).
pub fn linear(x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    let dims = x.dims().to_vec();
    let inp = *dims.last().unwrap_or(&0);
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let y = x.reshape((rows, inp))?.matmul(&w.t()?)?;
    let mut out = dims;
    if let Some(l) = out.last_mut() {
        *l = w.dim(0)?;
    }
    y.reshape(out)
}

/// Ensures f32.
pub fn f32(x: &Tensor) -> candle::Result<Tensor> {
    x.to_dtype(DType::F32)
}
