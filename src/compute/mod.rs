//! The compute seam: every operation whose implementation depends on the device, behind one
//! call each, chosen inside (the Metal kernels when the data lives there, the host kernels
//! otherwise). The model calls these and never branches on the device; `gpu::metal` holds the
//! Metal side and reads its inputs through `matvec_io`. Owns no weights and no state.

use candle::{DType, Device, Layout, Shape, Tensor};

use crate::experts::ExpertBytes;
use crate::mxfp4::{Kernel, Mxfp4Expert};
use crate::spine::dense::DenseMatrix;
use crate::Result;

/// `x · Wᵀ` for `x` `[.., in]` with a spine matrix `W` `[out, in]`, through the fused kernel.
pub fn dense(x: &Tensor, w: &DenseMatrix) -> Result<Tensor> {
    if let Some(r) = crate::gpu::dense(x, w) {
        return r;
    }
    // The host kernel.
    let dims = x.dims().to_vec();
    let inp = *dims.last().unwrap_or(&0);
    if inp != w.cols {
        return Err(crate::Error::Msg(format!(
            "input width {inp} != matrix columns {}",
            w.cols
        )));
    }
    let t: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let mut ys = vec![0f32; t * w.rows];
    crate::spine::dense::gemm(w, &xs, t, &mut ys)?;
    let out = with_last_dim(&dims, w.rows);
    Ok(Tensor::from_vec(ys, out, x.device())?)
}

/// One MoE layer's selected experts: pair `(k, t)` runs expert span `spans[k]` on latent row `t`
/// of `z` `[T, latent]` (the pairs of one expert consecutive); returns `[pairs, latent]`. On the
/// host each expert is one task, single-threaded (`Mxfp4Expert::forward_all`).
#[allow(clippy::too_many_arguments)]
pub fn run_experts(
    device: &Device,
    kernel: Kernel,
    spans: &[ExpertBytes],
    pairs: &[(usize, usize)],
    z: &[f32],
    (inter, latent): (usize, usize),
    (beta, linear_beta): (f32, f32),
) -> Result<Vec<f32>> {
    if let Some(y) = crate::gpu::run_experts(
        device,
        spans,
        pairs,
        z,
        (inter, latent),
        (beta, linear_beta),
    ) {
        return y;
    }
    // Each expert's rows gathered in pair order: `[rows_k, latent]`.
    let mut inputs: Vec<(usize, Vec<f32>, usize)> = Vec::new();
    for &(k, t) in pairs {
        if inputs.last().is_none_or(|(kk, _, _)| *kk != k) {
            inputs.push((k, Vec::new(), 0));
        }
        if let Some((_, rows, n)) = inputs.last_mut() {
            rows.extend_from_slice(&z[t * latent..(t + 1) * latent]);
            *n += 1;
        }
    }
    let jobs = inputs
        .iter()
        .map(|(k, rows, n)| {
            let span = spans.get(*k).ok_or_else(|| {
                crate::Error::Msg(format!("expert pair names span {k} of {}", spans.len()))
            })?;
            Ok((Mxfp4Expert::from_span(span, inter, latent)?, &rows[..], *n))
        })
        .collect::<Result<Vec<_>>>()?;
    let outs = Mxfp4Expert::forward_all(kernel, &jobs, beta, linear_beta)?;
    Ok(outs.concat())
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
