//! One MoE layer's selected experts on the device (`run_experts`): Metal's MXFP4 kernel for the
//! experts it runs (through `compute`), the host kernels of `ExpertFfn::forward` otherwise. The
//! device branch for experts lives here, beside the expert description it reads, so `compute`
//! never names a MoE type.

use candle::Device;

use super::ExecOptions;
use super::ExpertFfn;
use crate::experts::ExpertBytes;
use crate::Result;

/// One MoE layer's selected experts: pair `(k, t)` runs expert span `spans[k]` on row `t` of
/// `z` `[T, width]` (the pairs of one expert consecutive); returns `[pairs, width]`. On the host
/// each expert is one task, single-threaded, on the current rayon pool (fewer hand-offs than
/// splitting every GEMV's rows; each output is the same whatever thread computes it). Metal runs
/// the MXFP4 SiTU experts with K3's part order (`ExpertFfn::metal_situ`); any other expert runs
/// on the host whatever the device.
pub fn run_experts(
    device: &Device,
    opts: &ExecOptions,
    ffn: &ExpertFfn,
    spans: &[ExpertBytes],
    pairs: &[(usize, usize)],
    z: &[f32],
) -> Result<Vec<f32>> {
    #[cfg(feature = "metal")]
    if let (Device::Metal(d), Some((beta, lb))) = (device, ffn.metal_situ()) {
        return crate::compute::metal_experts(d, spans, pairs, z, ffn.inter, ffn.width, beta, lb);
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
        .map(|(span, zs, n)| ffn.forward(opts, span, zs, *n, false))
        .collect::<Result<_>>()?;
    Ok(outs.concat())
}
