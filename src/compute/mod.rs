//! The compute seam: every operation whose implementation depends on the device, behind one
//! call each, chosen inside (the Metal kernels when the data lives there, the host kernels
//! otherwise): the spine matrices' GEMV (`dense`), one MoE layer's MXFP4 expert batch
//! (`run_experts`, any `ExpertFfn`), and the spine's device side (`spine_device`: template layers and pinned
//! copies). The device is chosen once (`device::select`); the model calls these and never
//! branches on it. `metal` (behind the `metal` feature) holds the Metal side. Owns no weights
//! and no state; depends on `spine`, `experts` and `mxfp4`, never the reverse.

pub mod device;
#[cfg(feature = "metal")]
mod metal;

use std::sync::Arc;

use candle::{Device, Tensor};

use crate::experts::ExpertBytes;
use crate::kernels::dense::DenseMatrix;
use crate::kernels::HostDense;
use crate::moe::ExpertFfn;
use crate::mxfp4::{with_last_dim, Kernel};
use crate::spine::DeviceSide;
use crate::Result;

/// `x · Wᵀ` for `x` `[.., in]` with a spine matrix `W` `[out, in]`, through the fused kernel.
pub fn dense(x: &Tensor, w: &DenseMatrix) -> Result<Tensor> {
    #[cfg(feature = "metal")]
    if let (Some(r), true) = (w.device, x.device().is_metal()) {
        return metal::dense(x, w, &r);
    }
    // The host kernel, reading the input in place.
    let inp = x.dims().last().copied().unwrap_or(0);
    if inp != w.cols {
        return Err(crate::Error::Msg(format!(
            "input width {inp} != matrix columns {}",
            w.cols
        )));
    }
    if x.device().is_cpu() {
        return Ok(x.contiguous()?.apply_op1_no_bwd(&HostDense(w))?);
    }
    // A device tensor whose matrix has no device copy: through the host and back.
    let dims = x.dims().to_vec();
    let t: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let mut ys = vec![0f32; t * w.rows];
    crate::kernels::dense::gemm(w, &xs, t, &mut ys)?;
    Ok(Tensor::from_vec(
        ys,
        with_last_dim(&dims, w.rows),
        x.device(),
    )?)
}

/// One MoE layer's selected experts: pair `(k, t)` runs expert span `spans[k]` on row `t` of
/// `z` `[T, width]` (the pairs of one expert consecutive); returns `[pairs, width]`. On the host
/// each expert is one task, single-threaded, on the current rayon pool (fewer hand-offs than
/// splitting every GEMV's rows; each output is the same whatever thread computes it). Metal runs
/// the MXFP4 SiTU experts with K3's part order (`ExpertFfn::metal_situ`); any other expert runs
/// on the host whatever the device.
pub fn run_experts(
    device: &Device,
    kernel: Kernel,
    ffn: &ExpertFfn,
    spans: &[ExpertBytes],
    pairs: &[(usize, usize)],
    z: &[f32],
) -> Result<Vec<f32>> {
    #[cfg(feature = "metal")]
    if let (Device::Metal(d), Some((beta, lb))) = (device, ffn.metal_situ()) {
        return metal::run_experts(d, spans, pairs, z, ffn.inter, ffn.width, beta, lb);
    }
    #[cfg(not(feature = "metal"))]
    let _ = device;
    use rayon::prelude::*;
    let width = ffn.width;
    // Each expert's rows gathered in pair order: `[rows_k, width]`.
    let mut inputs: Vec<(usize, Vec<f32>, usize)> = Vec::new();
    for &(k, t) in pairs {
        if inputs.last().is_none_or(|(kk, _, _)| *kk != k) {
            inputs.push((k, Vec::new(), 0));
        }
        if let Some((_, rows, n)) = inputs.last_mut() {
            rows.extend_from_slice(&z[t * width..(t + 1) * width]);
            *n += 1;
        }
    }
    let jobs = inputs
        .iter()
        .map(|(k, rows, n)| {
            let span = spans.get(*k).ok_or_else(|| {
                crate::Error::Msg(format!("expert pair names span {k} of {}", spans.len()))
            })?;
            Ok((&span[..], &rows[..], *n))
        })
        .collect::<Result<Vec<_>>>()?;
    let outs: Vec<Vec<f32>> = jobs
        .par_iter()
        .map(|(span, zs, n)| ffn.forward(kernel, span, zs, *n, false))
        .collect::<Result<_>>()?;
    Ok(outs.concat())
}

/// The spine's side on `device` (Metal: template layers and pinned copies), or `None` where the
/// host kernels read the host bytes (the CPU).
pub fn spine_device(device: &Device) -> Option<Arc<dyn DeviceSide>> {
    #[cfg(feature = "metal")]
    if let Device::Metal(d) = device {
        return Some(Arc::new(metal::SpineDevice::new(d.clone())));
    }
    let _ = device;
    None
}
