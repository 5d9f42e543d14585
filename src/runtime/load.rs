//! What a caller asks of a model's loading: the memory limit, the RAM tier, the context, the
//! spine format, the expert store's settings (`LoadOptions`). Every family's loader takes them
//! (`runtime::family::ModelFamily::open`) and resolves the `None` fields with its memory plan.
//! Owns the options only, no loading.

use crate::experts::{DiskCache, TieredOptions};
use crate::kernels::dense::DenseKernel;
use crate::mxfp4::Kernel;
use crate::spine::source::SpineChoice;

/// What the caller asks of the plan and the stores; `None` fields are the plan's to pick.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Memory limit in bytes (`--memory-gb`; default: the smallest of `MemAvailable`, the
    /// cgroup limit and `MemTotal`).
    pub memory_limit: Option<u64>,
    /// OS reserve in bytes (`--reserve-gb`; default: `runtime::memory::reserve` of the limit).
    pub memory_reserve: Option<u64>,
    /// Expert RAM tier in bytes (`--ram-gb`).
    pub expert_ram: Option<u64>,
    /// Context limit in tokens (`--context`).
    pub context: Option<usize>,
    /// Most bytes of spine layers to pin (`--spine-resident-gb`).
    pub resident_cap: Option<u64>,
    /// Extra sequence states the caller keeps.
    pub saved_states: usize,
    /// Sequences decoding at once in shared passes, each state charged (None: the plan picks
    /// up to 8; the server's `--max-batch`).
    pub max_batch: Option<usize>,
    /// RAM the prompt cache's entries may hold (a line of the plan).
    pub prompt_cache: CacheRam,
    /// Spine format.
    pub spine: SpineChoice,
    /// Expert store settings; the plan sets the RAM tier and the prefetch cap.
    pub store: TieredOptions,
    /// Raw-span disk cache.
    pub cache: Option<DiskCache>,
    /// Read streamed spine layers with parallel `O_DIRECT` requests (`None`: when the streamed
    /// layers exceed what the memory limit leaves the page cache after the plan's charges).
    pub direct_spine: Option<bool>,
    /// The MXFP4 expert kernel (`--kernel`): `Kernel::best()` (exact, the default) or
    /// `Kernel::fastest()` (int8 activations where the CPU has VNNI; see `mxfp4::int8`).
    pub kernel: Kernel,
    /// The dense (spine) matrices' arithmetic (`--kernel`): `DenseKernel::Exact` (the default)
    /// or `DenseKernel::Fast` (fused multiply-adds; see `kernels::dense_fma`). BF16 routed
    /// experts run through the same dense kernels and follow it too (`ExecOptions::dense`).
    pub dense_kernel: DenseKernel,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            memory_limit: None,
            memory_reserve: None,
            expert_ram: None,
            context: None,
            resident_cap: None,
            saved_states: 0,
            max_batch: Some(1),
            prompt_cache: CacheRam::Off,
            spine: SpineChoice::Auto,
            store: TieredOptions::default(),
            cache: None,
            direct_spine: None,
            kernel: Kernel::best(),
            dense_kernel: DenseKernel::Exact,
        }
    }
}

/// How much RAM the prompt cache may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheRam {
    /// No prompt cache.
    #[default]
    Off,
    /// Four snapshots of a 4,096-token sequence (K3: about 2.7 GB).
    Auto,
    /// This many bytes (`--prompt-cache-gb`).
    Bytes(u64),
}
