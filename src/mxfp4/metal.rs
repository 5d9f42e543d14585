//! The `Mxfp4Weights` op on Metal (`metal_fwd`): the packed codes and scales are uploaded once
//! per device and kept by the op, then one `mxfp4_gemv` dispatch per input row.

use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{DType, Layout, MetalStorage, Shape};
use candle_metal_kernels::metal::{Buffer, ComputeCommandEncoder};
use candle_metal_kernels::set_params;
use candle_metal_kernels::utils::{Input, Output};

use crate::shaders::{kernels, linear_split};

/// An MXFP4 matrix's packed codes and scales on one device.
pub type Uploaded =
    std::sync::Mutex<Option<(candle::metal_backend::DeviceId, Arc<Buffer>, Arc<Buffer>)>>;

/// `metal_fwd` of `Mxfp4Weights`: the packed codes and scales are uploaded once per device (kept
/// by the op), then one `mxfp4_gemv` dispatch per input row.
pub fn mxfp4_matvec(
    w: &crate::mxfp4::Mxfp4Weights,
    uploaded: &Uploaded,
    storage: &MetalStorage,
    layout: &Layout,
) -> candle::Result<(MetalStorage, Shape)> {
    let device = storage.device();
    let m = w.matrix();
    let io = super::op::matvec_io("mxfp4 matvec", storage.dtype(), layout, m.cols, m.rows)?;
    let (start, tokens) = (io.start, io.tokens);
    let (packed, scales) = {
        let mut u = uploaded.lock().map_err(crate::shaders::metal_err)?;
        match u.as_ref() {
            Some((id, p, s)) if *id == device.id() => (p.clone(), s.clone()),
            _ => {
                let p = device.new_buffer_with_data(m.packed)?;
                let s = device.new_buffer_with_data(m.scales)?;
                *u = Some((device.id(), p.clone(), s.clone()));
                (p, s)
            }
        }
    };
    let n = tokens * m.rows;
    let output = device
        .new_buffer_builder()
        .with_size_for(n, DType::F32)
        .with_label("mxfp4-matvec")
        .build()?;
    if n > 0 {
        let pipeline = kernels(device)?.pipeline(device, "mxfp4_gemv")?;
        let (g, t) = linear_split(&pipeline, m.rows);
        let (rows, cols) = (m.rows as u32, m.cols as u32);
        let encoder = device.command_encoder()?;
        encoder.set_label("mxfp4-matvec");
        let enc: &ComputeCommandEncoder = encoder.as_ref();
        enc.set_compute_pipeline_state(&pipeline);
        for tok in 0..tokens {
            let x = Input::with_offset(storage.buffer(), 4 * (start + tok * m.cols));
            let y = Output::with_offset(&output, 4 * tok * m.rows);
            set_params!(
                enc,
                (Input::new(&packed), Input::new(&scales), x, y, rows, cols)
            );
            enc.dispatch_thread_groups(g, t);
        }
    }
    Ok((
        MetalStorage::new(output, device.clone(), n, DType::F32),
        io.shape,
    ))
}
