//! The store, spine and memory flags shared by every command that runs the model, and
//! `load_engine`: the engine under the memory plan, with the startup report (the plan as a
//! table).

use std::path::{Path, PathBuf};

use clap::Args;

use deltafin::experts::{CacheAdvice, DiskCache, TieredOptions};
use deltafin::kernels::dense::DenseKernel;
use deltafin::mxfp4::Kernel;
use deltafin::runtime::load::CacheRam;
use deltafin::runtime::load::LoadOptions;
use deltafin::spine::source::SpineChoice;
use deltafin::Model;
use deltafin::{Engine, EngineOptions};

/// Expert-store, spine and memory settings shared by the commands that run the model.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Memory limit in GB for the memory plan (default: the smallest of MemAvailable, the
    /// cgroup limit and MemTotal).
    #[arg(long)]
    pub memory_gb: Option<f64>,
    /// Memory in GB held back from the plan for the OS, the page cache and allocator slack
    /// (default: a tenth of the limit, at least 1.5 GB or a quarter of the limit if less).
    #[arg(long)]
    pub reserve_gb: Option<f64>,
    /// RAM tier budget for routed experts, in GiB (default: the memory plan's choice: at most 4 beside streamed spine layers, all the spare budget where the dense layers stay resident).
    #[arg(long)]
    pub ram_gb: Option<f64>,
    /// Context limit in tokens (default: the largest power of two whose sequence state takes at
    /// most a tenth of the memory budget, within the config's max_position_embeddings).
    #[arg(long)]
    pub context: Option<usize>,
    /// Concurrent expert readers.
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// Raw-span disk cache directory (`L{layer}-E{expert}.bin` files).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// A storage home: a directory on another drive holding experts (all or the hottest, see
    /// `populate-home`); each read goes to the home expected to finish first. Repeatable; added
    /// to the homes `install.json` records.
    #[arg(long = "storage-home")]
    pub storage_homes: Vec<PathBuf>,
    /// Verify expert cache files (`--cache-dir`, or a streaming install's `experts/`) against the
    /// checksum recorded when they were written; a missing or wrong checksum is refetched.
    #[arg(long)]
    pub verify_cache: bool,
    /// Do not prefetch the previous position's experts.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Let prefetch fetch from the hub on a streaming install (off: prefetch reads only the
    /// disk cache and local shards).
    #[arg(long)]
    pub prefetch_hub: bool,
    /// Page-cache policy for expert reads: auto (drop after reading) or off.
    #[arg(long, default_value = "auto")]
    pub page_cache: String,
    /// Spine format: auto (row-int8 if converted, else BF16), int8, or bf16 (original weights).
    #[arg(long, default_value = "auto")]
    pub spine: String,
    /// Most GB of spine layers to keep resident (default: what the memory plan allows).
    #[arg(long)]
    pub spine_resident_gb: Option<f64>,
    /// Compute device for the spine: auto (Metal when built with `--features metal` and a GPU
    /// exists, else the CPU), cpu, or metal.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: deltafin::compute::device::DeviceChoice,
    /// Kernels: exact (fp32, bit-identical to the reference kernels) or fast (experts: int8
    /// activations with AVX-512 VNNI or ARM64's NEON, about 1.4x the expert kernel's prefill
    /// speed, about 1% error per matrix; dense spine matrices: fused multiply-adds with
    /// AVX-512F or NEON, about 1.7x at 64 rows; see docs/correctness.md).
    #[arg(long, value_enum, default_value = "exact")]
    pub kernel: KernelArg,
}

/// `--kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KernelArg {
    /// The fastest kernels: `Kernel::fastest` for the experts, `DenseKernel::Fast` for the
    /// dense matrices.
    Fast,
    /// The fastest exact ones: `Kernel::best`, `DenseKernel::Exact`.
    Exact,
}

impl KernelArg {
    /// The kernel this choice runs on this CPU.
    pub fn kernel(self) -> Kernel {
        match self {
            KernelArg::Fast => Kernel::fastest(),
            KernelArg::Exact => Kernel::best(),
        }
    }

    /// The spine's arithmetic this choice asks for (fast only where the CPU has it).
    pub fn dense(self) -> DenseKernel {
        match self {
            KernelArg::Fast => DenseKernel::Fast,
            KernelArg::Exact => DenseKernel::Exact,
        }
    }
}

fn non_negative(v: Option<f64>, flag: &str, unit: f64) -> anyhow::Result<Option<u64>> {
    match v {
        Some(x) if x >= 0.0 && x.is_finite() => Ok(Some((x * unit) as u64)),
        Some(_) => anyhow::bail!("{flag} must be a non-negative number"),
        None => Ok(None),
    }
}

impl StoreArgs {
    /// The load options these flags describe; `saved_states` extra sequence states are charged.
    pub fn load_options(&self, saved_states: usize) -> anyhow::Result<LoadOptions> {
        let advice = match self.page_cache.as_str() {
            "auto" => CacheAdvice::Auto,
            "off" => CacheAdvice::Off,
            other => anyhow::bail!("--page-cache {other}: use auto or off"),
        };
        let spine = match self.spine.as_str() {
            "auto" => SpineChoice::Auto,
            "int8" => SpineChoice::Int8,
            "bf16" => SpineChoice::Bf16,
            other => anyhow::bail!("--spine {other}: use auto, int8 or bf16"),
        };
        if self.context == Some(0) {
            anyhow::bail!("--context must be at least 1");
        }
        let cache = match &self.cache_dir {
            Some(d) => {
                let mut c = DiskCache::new(d, advice)?;
                c.verify = self.verify_cache;
                Some(c)
            }
            None => None,
        };
        Ok(LoadOptions {
            memory_limit: non_negative(self.memory_gb, "--memory-gb", 1e9)?,
            memory_reserve: non_negative(self.reserve_gb, "--reserve-gb", 1e9)?,
            expert_ram: non_negative(self.ram_gb, "--ram-gb", (1u64 << 30) as f64)?,
            context: self.context,
            resident_cap: non_negative(self.spine_resident_gb, "--spine-resident-gb", 1e9)?,
            saved_states,
            max_batch: Some(1),
            spine,
            store: TieredOptions {
                readers: self.readers.max(1),
                advice,
                prefetch_previous: !self.no_prefetch,
                prefetch_hub: self.prefetch_hub,
                verify_cache: self.verify_cache,
                homes: self.storage_homes.clone(),
                ..Default::default()
            },
            cache,
            direct_spine: None,
            prompt_cache: CacheRam::Off,
            kernel: self.kernel.kernel(),
            dense_kernel: self.kernel.dense(),
        })
    }
}

/// Opens the engine under the memory plan and prints the startup report on stderr (the plan as
/// a table, the device, the expert tiers and the spine).
pub fn load_engine(root: &Path, store: &StoreArgs, saved_states: usize) -> anyhow::Result<Engine> {
    load_engine_with(root, store, (saved_states, Some(1)), CacheRam::Off)
}

/// `load_engine` with a prompt-cache line in the plan, and the batch its states are charged
/// for (`None`: the plan picks).
pub fn load_engine_with(
    root: &Path,
    store: &StoreArgs,
    (saved_states, max_batch): (usize, Option<usize>),
    prompt_cache: CacheRam,
) -> anyhow::Result<Engine> {
    let mut load = store.load_options(saved_states)?;
    load.max_batch = max_batch;
    load.prompt_cache = prompt_cache;
    let opts = EngineOptions {
        load,
        device: store.device,
    };
    let engine = Engine::open_with(root, &opts, |p| eprintln!("{p}"))?;
    print_summary(root, store, engine.model())?;
    Ok(engine)
}

/// The lines a front end prints once the model is open: device, expert store, spine, context.
fn print_summary(root: &Path, store: &StoreArgs, model: &dyn Model) -> anyhow::Result<()> {
    let streaming = deltafin::installed::read_manifest(root)
        .filter(|m| m.mode == deltafin::installed::Mode::Stream);
    eprintln!(
        "device: {} (host: {} threads); experts: RAM tier {:.2} GB{}{}, {} readers, prefetch {}",
        deltafin::compute::device::describe(model.device()),
        rayon::current_num_threads(),
        model.plan().map_or(0, |p| p.expert_ram) as f64 / 1e9,
        if store.cache_dir.is_some() {
            ", disk cache"
        } else {
            ""
        },
        match streaming {
            Some(_) => ", disk cache + hub (streaming install)",
            None => ", local shards",
        },
        store.readers,
        match model.plan().map(|p| p.prefetch_cap) {
            Some(c) if c > 0 => format!("on (cap {:.2} GB)", c as f64 / 1e9),
            _ => "off".into(),
        }
    );
    match model.spine_report() {
        Some(r) => eprintln!(
            "spine: {} from {}; {} layers pinned ({:.2} GB), {} streamed; spine bytes read per token: {:.2} GB; context limit {} tokens",
            r.format.dir_name(),
            if r.from_store { "the converted store" } else { "the checkpoint shards" },
            r.layers_pinned,
            r.resident_bytes as f64 / 1e9,
            r.layers_streamed,
            r.bytes_read_per_token as f64 / 1e9,
            model.context_limit()
        ),
        None => eprintln!(
            "dense weights mapped and resident; context limit {} tokens",
            model.context_limit()
        ),
    }
    if let Some(m) = streaming {
        let missing = deltafin::install::missing_experts(root, None)?;
        let (n, bytes): (usize, u64) = missing
            .iter()
            .fold((0, 0), |(n, b), t| (n + t.1.len(), b + t.2));
        let inv = deltafin::checkpoint::Inventory::from_dir(root)?;
        let total = deltafin::models::family(root)?
            .expert_index(root, &inv)?
            .count();
        eprintln!(
            "experts: streaming install of {}: {} of {} experts local; `deltafin fetch-experts` would download {}",
            m.repo,
            total - n,
            total,
            indicatif::HumanBytes(bytes)
        );
    }
    Ok(())
}

/// Peak resident memory (`VmHWM`) and the plan's total, for end-of-run reports.
pub fn memory_report(model: &dyn Model) -> serde_json::Value {
    let (_, peak) = deltafin::runtime::memory::rss();
    serde_json::json!({
        "peak_rss_bytes": peak,
        "plan": model.plan(),
    })
}
