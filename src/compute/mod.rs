//! The compute seam: every operation whose implementation depends on the device, behind one
//! call each, chosen inside (the Metal kernels when the data lives there, the host kernels
//! otherwise): the spine matrices' GEMV (`dense`), Metal's MXFP4 expert batch
//! (`metal_experts`, called by `moe::device::run_experts`), and the spine's device side
//! (`spine_device`: template layers and pinned copies). The device is chosen once (`device::select`); the model calls these and never
//! branches on it. `metal` (behind the `metal` feature) holds the Metal side. Owns no weights
//! and no state; depends on `spine`, `experts` and `mxfp4`, never the reverse.

pub mod device;
#[cfg(feature = "metal")]
mod metal;
#[cfg(feature = "metal")]
pub use metal::run_experts as metal_experts;

use std::sync::Arc;

use candle::{Device, Tensor};

use crate::kernels::dense::DenseMatrix;
use crate::kernels::HostDense;
use crate::mxfp4::with_last_dim;
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
