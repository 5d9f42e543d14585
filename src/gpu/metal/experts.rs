//! MXFP4 on Metal: one layer's selected experts in two dispatches (gate+up with SiTU for every
//! (expert, row) pair, then down), reading the experts' raw spans from a staging buffer; and the
//! generic `Mxfp4Weights` op's `metal_fwd`.

use std::sync::Arc;

use candle::backend::BackendStorage;
use candle::{DType, Layout, MetalDevice, MetalStorage, Shape};
use candle_metal_kernels::metal::{Buffer, ComputeCommandEncoder};
use candle_metal_kernels::set_params;
use candle_metal_kernels::utils::{Input, Output};

use super::{kernels, linear_split, shared_buffer, write_shared};

/// Routed experts of one layer on the GPU: pair `p = (span index, z row)` computes
/// `w2 · SiTU(w1 z, w3 z)` for expert `spans[p.0]` and latent row `z[p.1]`. Returns `[pairs,
/// latent]` on the host.
#[allow(clippy::too_many_arguments)]
pub fn run_experts(
    device: &MetalDevice,
    spans: &[&[u8]],
    pairs: &[(usize, usize)],
    z: &[f32],
    inter: usize,
    latent: usize,
    beta: f32,
    linear_beta: f32,
) -> crate::Result<Vec<f32>> {
    let np = pairs.len();
    if np == 0 {
        return Ok(Vec::new());
    }
    let k = kernels(device)?;
    let (gate_up, down) = (
        k.pipeline(device, "mxfp4_experts_gate_up")?,
        k.pipeline(device, "mxfp4_experts_down")?,
    );
    let mut offsets = Vec::with_capacity(spans.len());
    let mut total = 0usize;
    for s in spans {
        offsets.push(total as u64);
        total += s.len();
    }
    let mut base = Vec::with_capacity(np);
    let mut zin = Vec::with_capacity(np * latent);
    for &(e, t) in pairs {
        let (Some(off), Some(row)) = (offsets.get(e), z.get(t * latent..(t + 1) * latent)) else {
            return Err(crate::Error::Msg(format!(
                "expert pair ({e}, {t}) out of range"
            )));
        };
        base.push(*off);
        zin.extend_from_slice(row);
    }
    let stage: Arc<Buffer> = {
        let mut slot = k.stage.lock().map_err(super::metal_err)?;
        // The previous layer's dispatch may still read the staging buffer.
        device.wait_until_completed()?;
        if slot.as_ref().is_none_or(|b| b.length() < total) {
            if let Some(old) = slot.take() {
                device.unregister_buffers([&*old]);
            }
            *slot = Some(shared_buffer(device, total)?);
        }
        let b = slot
            .clone()
            .ok_or_else(|| crate::Error::Msg("metal: no staging buffer".into()))?;
        for (s, off) in spans.iter().zip(&offsets) {
            write_shared(&b, *off as usize, s)?;
        }
        b
    };
    let base = device.new_buffer_with_data(&base)?;
    let zbuf = device.new_buffer_with_data(&zin)?;
    let h = device
        .new_buffer_builder()
        .with_size_for(np * inter, DType::F32)
        .with_label("deltafin-experts-h")
        .build()?;
    let y = device
        .new_buffer_builder()
        .with_size_for(np * latent, DType::F32)
        .with_label("deltafin-experts-y")
        .build()?;
    let (i, l, p) = (inter as u32, latent as u32, np as u32);
    {
        let encoder = device.command_encoder()?;
        encoder.set_label("deltafin-experts");
        let enc: &ComputeCommandEncoder = encoder.as_ref();
        enc.set_compute_pipeline_state(&gate_up);
        set_params!(
            enc,
            (
                Input::new(&stage),
                Input::new(&base),
                Input::new(&zbuf),
                Output::new(&h),
                i,
                l,
                p,
                beta,
                linear_beta
            )
        );
        let (g, t) = linear_split(&gate_up, np * inter);
        enc.dispatch_thread_groups(g, t);
        enc.set_compute_pipeline_state(&down);
        set_params!(
            enc,
            (
                Input::new(&stage),
                Input::new(&base),
                Input::new(&h),
                Output::new(&y),
                i,
                l,
                p
            )
        );
        let (g, t) = linear_split(&down, np * latent);
        enc.dispatch_thread_groups(g, t);
    }
    let ys = MetalStorage::new(y, device.clone(), np * latent, DType::F32).to_cpu_storage()?;
    Ok(ys.as_slice::<f32>()?.to_vec())
}

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
    if storage.dtype() != DType::F32 {
        candle::bail!("mxfp4 matvec: input must be f32");
    }
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle::bail!("mxfp4 matvec: input must be contiguous");
    };
    let dims = layout.shape().dims();
    if dims.last().copied() != Some(m.cols) {
        candle::bail!("mxfp4 matvec: input last dim != cols {}", m.cols);
    }
    let tokens = (end - start) / m.cols;
    let (packed, scales) = {
        let mut u = uploaded.lock().map_err(super::metal_err)?;
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
    let mut out_dims = dims.to_vec();
    if let Some(l) = out_dims.last_mut() {
        *l = m.rows;
    }
    Ok((
        MetalStorage::new(output, device.clone(), n, DType::F32),
        Shape::from(out_dims),
    ))
}
