//! Our Metal shader library (`metal/*.metal`) and its plumbing, shared by the MXFP4 op
//! (`mxfp4::metal`) and the compute seam (`compute::metal`); it knows no model, spine or expert
//! type. Metal glue for our shaders (`metal/*.metal`), modelled line by line on Candle 0.11.1's own
//! Metal ops (candle-nn `ops.rs` rms_norm `metal_fwd`, candle-metal-kernels `call_*`): the
//! library is compiled once per device from `include_str!` sources, pipelines are cached, every
//! dispatch goes through the device's shared command encoder with written buffers bound as
//! `Output`, and no other Candle op runs while the encoder guard is held.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use candle::metal_backend::DeviceId;
use candle::MetalDevice;
use candle_metal_kernels::metal::{Buffer, ComputePipeline, Library};
use objc2_metal::MTLSize;

/// The shader sources, joined behind one copy of the compatibility header (a source library has
/// no include path).
fn source() -> String {
    const COMPAT: &str = include_str!("../metal/compat.h");
    const MXFP4: &str = include_str!("../metal/mxfp4.metal");
    const DENSE: &str = include_str!("../metal/dense.metal");
    let strip = |s: &str| s.replace("#include \"compat.h\"", "");
    format!("{COMPAT}\n{}\n{}", strip(MXFP4), strip(DENSE))
}

/// Compile options: precise math, so the kernels keep the CPU reference's operation order
/// (fast math may reassociate the fixed reductions).
fn compile_options() -> objc2::rc::Retained<objc2_metal::MTLCompileOptions> {
    use objc2_metal::{MTLMathFloatingPointFunctions, MTLMathMode};
    let o = objc2_metal::MTLCompileOptions::new();
    if objc2::available!(macos = 15, ios = 18) {
        o.setMathMode(MTLMathMode::Safe);
        o.setMathFloatingPointFunctions(MTLMathFloatingPointFunctions::Precise);
    } else {
        #[allow(deprecated)]
        o.setFastMathEnabled(false);
    }
    o
}

/// One device's compiled library, its pipelines, and the experts' staging buffer.
pub(crate) struct Kernels {
    library: Library,
    pipelines: Mutex<HashMap<&'static str, ComputePipeline>>,
    /// Shared (host-visible) buffer the selected experts' spans are copied into.
    pub(crate) stage: Mutex<Option<Arc<Buffer>>>,
}

pub(crate) fn metal_err(e: impl std::fmt::Display) -> candle::Error {
    candle::Error::Msg(format!("metal: {e}"))
}

/// The kernels of `device`, compiling the library on first use.
pub(crate) fn kernels(device: &MetalDevice) -> candle::Result<Arc<Kernels>> {
    static CACHE: OnceLock<Mutex<HashMap<DeviceId, Arc<Kernels>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut map = cache.lock().map_err(metal_err)?;
    if let Some(k) = map.get(&device.id()) {
        return Ok(k.clone());
    }
    let library = device
        .metal_device()
        .new_library_with_source(&source(), Some(&compile_options()))
        .map_err(metal_err)?;
    let k = Arc::new(Kernels {
        library,
        pipelines: Mutex::new(HashMap::new()),
        stage: Mutex::new(None),
    });
    map.insert(device.id(), k.clone());
    Ok(k)
}

impl Kernels {
    /// The pipeline of kernel `name`, built once.
    pub(crate) fn pipeline(
        &self,
        device: &MetalDevice,
        name: &'static str,
    ) -> candle::Result<ComputePipeline> {
        let mut p = self.pipelines.lock().map_err(metal_err)?;
        if let Some(x) = p.get(name) {
            return Ok(x.clone());
        }
        let f = self.library.get_function(name, None).map_err(metal_err)?;
        let pipe = device
            .metal_device()
            .new_compute_pipeline_state_with_function(&f)
            .map_err(metal_err)?;
        p.insert(name, pipe.clone());
        Ok(pipe)
    }
}

/// One thread per element of `n`, in thread groups as wide as the pipeline allows (Candle's
/// `linear_split`, which is crate-private).
pub(crate) fn linear_split(pipeline: &ComputePipeline, n: usize) -> (MTLSize, MTLSize) {
    let width = pipeline.max_total_threads_per_threadgroup().min(n).max(1);
    (
        MTLSize {
            width: n.div_ceil(width),
            height: 1,
            depth: 1,
        },
        MTLSize {
            width,
            height: 1,
            depth: 1,
        },
    )
}

/// A shared (host-visible) buffer of exactly `len` bytes, outside Candle's pool, registered in the
/// device's residency set.
pub(crate) fn shared_buffer(device: &MetalDevice, len: usize) -> candle::Result<Arc<Buffer>> {
    let b = device
        .metal_device()
        .new_buffer(
            len.max(1),
            candle_metal_kernels::metal::MTLResourceOptions::StorageModeShared,
        )
        .map_err(metal_err)?;
    device.register_buffers([&b]);
    Ok(Arc::new(b))
}

/// Copies `bytes` into `buf` at `offset`. The caller makes sure the GPU is not reading the range.
pub(crate) fn write_shared(buf: &Buffer, offset: usize, bytes: &[u8]) -> candle::Result<()> {
    if offset + bytes.len() > buf.length() {
        candle::bail!(
            "metal: write of {} bytes at {offset} overruns a {}-byte buffer",
            bytes.len(),
            buf.length()
        );
    }
    // SAFETY: `buf` is a shared-storage buffer (host-visible `contents`), the range was checked
    // above, and the source is a distinct host allocation.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.contents().add(offset), bytes.len());
    }
    Ok(())
}
