//! Primitive ops in the reference operation order (spec §3.1), as Candle ops on f32.

use candle::{DType, Layout, Shape, Tensor, D};

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

/// `dims` with the last dimension set to `n`: the shape of `x · Wᵀ` for `W` with `n` rows.
pub fn with_last_dim(dims: &[usize], n: usize) -> Vec<usize> {
    let mut out = dims.to_vec();
    if let Some(l) = out.last_mut() {
        *l = n;
    }
    out
}

/// What a matrix-vector custom op needs of its input `[.., cols]` (f32, contiguous).
pub struct MatvecIo {
    /// First element of the input in its storage.
    pub start: usize,
    /// Input rows (product of the leading dimensions).
    pub tokens: usize,
    /// Output shape `[.., rows]`.
    pub shape: Shape,
}

/// Checks a matvec op's input (`op` names the op in errors) and derives its `MatvecIo`.
pub fn matvec_io(
    op: &str,
    dtype: DType,
    layout: &Layout,
    cols: usize,
    rows: usize,
) -> candle::Result<MatvecIo> {
    if dtype != DType::F32 {
        candle::bail!("{op}: input must be f32, got {dtype:?}");
    }
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle::bail!("{op}: input must be contiguous");
    };
    let dims = layout.shape().dims();
    if dims.last().copied() != Some(cols) {
        candle::bail!("{op}: input {dims:?} does not end in {cols} columns");
    }
    Ok(MatvecIo {
        start,
        tokens: (end - start).checked_div(cols).unwrap_or(0),
        shape: Shape::from(with_last_dim(dims, rows)),
    })
}

/// `x · Wᵀ` for `x` `[.., in]` and `W` `[out, in]` (f32).
pub fn linear(x: &Tensor, w: &Tensor) -> candle::Result<Tensor> {
    let dims = x.dims();
    let inp = *dims.last().unwrap_or(&0);
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let y = x.reshape((rows, inp))?.matmul(&w.t()?)?;
    y.reshape(with_last_dim(dims, w.dim(0)?))
}

/// Ensures f32.
pub fn f32(x: &Tensor) -> candle::Result<Tensor> {
    x.to_dtype(DType::F32)
}
