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

/// SiTU: `((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin)`.
pub fn situ(g: &Tensor, u: &Tensor, beta: f64, linear_beta: f64) -> candle::Result<Tensor> {
    let gate = ((g / beta)?.tanh()? * beta)?.mul(&sigmoid(g)?)?;
    let up = ((u / linear_beta)?.tanh()? * linear_beta)?;
    gate.mul(&up)
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
