//! MXFP4 on Metal: one layer's selected experts in two dispatches (gate+up with SiTU for every
//! (expert, row) pair, then down), reading the experts' raw spans from a staging buffer.

use std::sync::Arc;

use candle::{DType, MetalDevice};
use candle_metal_kernels::metal::{Buffer, ComputeCommandEncoder};
use candle_metal_kernels::set_params;
use candle_metal_kernels::utils::{Input, Output};

use crate::experts::ExpertBytes;
use crate::fsio::PooledBuf;
use crate::shaders::{kernels, linear_split, shared_buffer, write_shared, Kernels};
use objc2_metal::MTLDevice;

/// The host memory of a pooled expert buffer as a Metal buffer, without copying: only when the
/// allocation is page-aligned and a whole number of pages (`newBufferWithBytesNoCopy`'s rule).
fn wrap_no_copy(device: &MetalDevice, b: &PooledBuf) -> Option<Buffer> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
    let (ptr, cap) = b.aligned_region()?;
    if page == 0
        || !(ptr as usize).is_multiple_of(page)
        || !cap.is_multiple_of(page)
        || cap < b.len()
    {
        return None;
    }
    let ptr = std::ptr::NonNull::new(ptr as *mut std::ffi::c_void)?;
    // SAFETY: the region is one live allocation of `cap` bytes owned by `b`, which the caller
    // keeps alive until the GPU work reading it has completed (`run_experts` waits before it
    // returns); no deallocator, so Metal never frees it. The GPU only reads it.
    let raw = unsafe {
        device
            .metal_device()
            .as_ref()
            .newBufferWithBytesNoCopy_length_options_deallocator(
                ptr,
                cap,
                objc2_metal::MTLResourceOptions::StorageModeShared,
                None,
            )
    }?;
    Some(Buffer::new(raw))
}

/// Where each expert's bytes are on the GPU: wrapped in place, or at an offset of the staging
/// buffer they were copied into.
struct Placed {
    wrapped: Vec<Option<Buffer>>,
    staged: Vec<u64>,
    stage: Option<Arc<Buffer>>,
}

impl Placed {
    /// The buffer that holds expert `e`.
    fn source(&self, e: usize) -> crate::Result<&Buffer> {
        match (&self.wrapped[e], &self.stage) {
            (Some(w), _) => Ok(w),
            (None, Some(s)) => Ok(s),
            (None, None) => Err(crate::Error::Msg("metal: expert not staged".into())),
        }
    }

    /// Byte offset of expert `e` in its buffer.
    fn base(&self, e: usize) -> Option<u64> {
        let off = *self.staged.get(e)?;
        Some(if self.wrapped[e].is_some() { 0 } else { off })
    }
}

/// Wraps every expert that can be read in place and copies the rest into the shared staging
/// buffer (grown when too small, after the previous layer's dispatch stops reading it).
fn place(device: &MetalDevice, k: &Kernels, spans: &[ExpertBytes]) -> crate::Result<Placed> {
    let wrapped: Vec<Option<Buffer>> = spans.iter().map(|b| wrap_no_copy(device, b)).collect();
    let mut staged = vec![0u64; spans.len()];
    let mut total = 0usize;
    for (i, s) in spans.iter().enumerate() {
        if wrapped[i].is_none() {
            staged[i] = total as u64;
            total += s.len();
        }
    }
    if total == 0 {
        return Ok(Placed {
            wrapped,
            staged,
            stage: None,
        });
    }
    let mut slot = k.stage.lock().map_err(crate::shaders::metal_err)?;
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
    for (i, s) in spans.iter().enumerate() {
        if wrapped[i].is_none() {
            write_shared(&b, staged[i] as usize, s)?;
        }
    }
    Ok(Placed {
        wrapped,
        staged,
        stage: Some(b),
    })
}

/// Runs of consecutive pairs on the same expert, `(expert, first pair, count)`: one dispatch
/// each.
fn expert_runs(pairs: &[(usize, usize)]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (p, &(e, _)) in pairs.iter().enumerate() {
        match runs.last_mut() {
            Some((re, p0, n)) if *re == e && *p0 + *n == p => *n += 1,
            _ => runs.push((e, p, 1)),
        }
    }
    runs
}

/// One layer's expert shapes and SiTU parameters, as the kernels take them.
#[derive(Clone, Copy)]
struct Dims {
    inter: usize,
    latent: usize,
    beta: f32,
    linear_beta: f32,
}

/// Routed experts of one layer on the GPU: pair `p = (span index, z row)` computes
/// `w2 · SiTU(w1 z, w3 z)` for expert `spans[p.0]` and latent row `z[p.1]`. Returns `[pairs,
/// latent]` on the host.
///
/// Each expert's bytes are read in place where Metal can wrap them (a pooled, page-aligned
/// buffer), else from a staging buffer they are copied into. One dispatch per expert and step:
/// all gate/up dispatches write separate buffers (no barrier between them), one barrier, then
/// all down dispatches, each into its own host-visible output.
#[allow(clippy::too_many_arguments)]
pub fn run_experts(
    device: &MetalDevice,
    spans: &[ExpertBytes],
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
    let placed = place(device, &k, spans)?;
    let mut base = Vec::with_capacity(np);
    let mut zin = Vec::with_capacity(np * latent);
    for &(e, t) in pairs {
        let (Some(off), Some(row)) = (placed.base(e), z.get(t * latent..(t + 1) * latent)) else {
            return Err(crate::Error::Msg(format!(
                "expert pair ({e}, {t}) out of range"
            )));
        };
        base.push(off);
        zin.extend_from_slice(row);
    }
    let runs = expert_runs(pairs);
    let base = device.new_buffer_with_data(&base)?;
    let zbuf = device.new_buffer_with_data(&zin)?;
    let dims = Dims {
        inter,
        latent,
        beta,
        linear_beta,
    };
    let ys = encode(device, &k, &placed, &runs, (&base, &zbuf), dims)?;
    // Also keeps the wrapped expert memory borrowed until the GPU is done with it.
    device.wait_until_completed()?;
    let mut out = Vec::with_capacity(np * latent);
    for (&(_, _, n), y) in runs.iter().zip(&ys) {
        // SAFETY: a shared-storage buffer of at least `n * latent` f32 that the completed
        // dispatch above wrote; nothing else writes it.
        let v = unsafe { std::slice::from_raw_parts(y.contents() as *const f32, n * latent) };
        out.extend_from_slice(v);
    }
    drop(placed);
    Ok(out)
}

/// Encodes the gate/up dispatches, then the down dispatches, one per run; returns each run's
/// host-visible output buffer (`[count, latent]` f32), valid once the device has completed.
fn encode(
    device: &MetalDevice,
    k: &Kernels,
    placed: &Placed,
    runs: &[(usize, usize, usize)],
    (base, zbuf): (&Buffer, &Buffer),
    d: Dims,
) -> crate::Result<Vec<Arc<Buffer>>> {
    let (gate_up, down) = (
        k.pipeline(device, "mxfp4_experts_gate_up")?,
        k.pipeline(device, "mxfp4_experts_down")?,
    );
    let (inter, latent) = (d.inter, d.latent);
    let mut hs = Vec::with_capacity(runs.len());
    let mut ys = Vec::with_capacity(runs.len());
    for &(_, _, n) in runs {
        hs.push(
            device
                .new_buffer_builder()
                .with_size_for(n * inter, DType::F32)
                .with_label("deltafin-experts-h")
                .build()?,
        );
        // Shared storage: read on the host after the caller's wait.
        ys.push(
            device
                .new_buffer_builder()
                .with_size(n * latent * DType::F32.size_in_bytes())
                .with_label("deltafin-experts-y")
                .build()?,
        );
    }
    let (i, l) = (inter as u32, latent as u32);
    let encoder = device.command_encoder()?;
    encoder.set_label("deltafin-experts");
    let enc: &ComputeCommandEncoder = encoder.as_ref();
    enc.set_compute_pipeline_state(&gate_up);
    for (&(e, p0, n), h) in runs.iter().zip(&hs) {
        set_params!(
            enc,
            (
                Input::new(placed.source(e)?),
                Input::with_offset(base, 8 * p0),
                Input::with_offset(zbuf, 4 * p0 * latent),
                Output::new(h),
                i,
                l,
                n as u32,
                d.beta,
                d.linear_beta
            )
        );
        let (g, t) = linear_split(&gate_up, n * inter);
        enc.dispatch_thread_groups(g, t);
    }
    enc.set_compute_pipeline_state(&down);
    for ((&(e, p0, n), h), y) in runs.iter().zip(&hs).zip(&ys) {
        set_params!(
            enc,
            (
                Input::new(placed.source(e)?),
                Input::with_offset(base, 8 * p0),
                Input::new(h),
                Output::new(y),
                i,
                l,
                n as u32
            )
        );
        let (g, t) = linear_split(&down, n * latent);
        enc.dispatch_thread_groups(g, t);
    }
    Ok(ys)
}
