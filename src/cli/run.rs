//! `deltafin run`: greedy generation from token ids.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;

use crate::experts::{CacheAdvice, DiskCache, ExpertStats, TieredOptions};
use crate::model::RouterTrace;
use crate::spine::budget::{reserve, resident_budget, Memory};
use crate::spine::source::{SpineChoice, SpineOptions};
use crate::{GenerateOptions, Generator, K3Model};

/// Expert-store settings shared by the commands that run the model.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// RAM tier budget for routed experts, in GiB.
    #[arg(long, default_value_t = 4.0)]
    pub ram_gb: f64,
    /// Concurrent expert readers.
    #[arg(long, default_value_t = 8)]
    pub readers: usize,
    /// Raw-span disk cache directory (`L{layer}-E{expert}.bin` files).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Verify cache files against the checksum recorded when they were written.
    #[arg(long)]
    pub verify_cache: bool,
    /// Do not prefetch the previous token's experts.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Page-cache policy for expert reads: auto (drop after reading) or off.
    #[arg(long, default_value = "auto")]
    pub page_cache: String,
    /// Spine format: auto (row-int8 if converted, else BF16), int8, or bf16 (original weights).
    #[arg(long, default_value = "auto")]
    pub spine: String,
    /// GB of spine layers to keep resident (default: what the RAM budget allows).
    #[arg(long)]
    pub spine_resident_gb: Option<f64>,
}

impl StoreArgs {
    /// The store settings and disk cache these arguments describe.
    pub fn build(&self) -> anyhow::Result<(TieredOptions, Option<DiskCache>)> {
        let advice = match self.page_cache.as_str() {
            "auto" => CacheAdvice::Auto,
            "off" => CacheAdvice::Off,
            other => anyhow::bail!("--page-cache {other}: use auto or off"),
        };
        if !(self.ram_gb >= 0.0 && self.ram_gb.is_finite()) {
            anyhow::bail!("--ram-gb must be a non-negative number");
        }
        let opts = TieredOptions {
            ram_budget: (self.ram_gb * (1u64 << 30) as f64) as usize,
            readers: self.readers.max(1),
            advice,
            prefetch_previous: !self.no_prefetch,
            ..Default::default()
        };
        let cache = match &self.cache_dir {
            Some(d) => {
                let mut c = DiskCache::new(d, advice)?;
                c.verify = self.verify_cache;
                Some(c)
            }
            None => None,
        };
        Ok((opts, cache))
    }

    /// The spine settings: format choice and how many bytes of layers to pin.
    pub fn spine_options(&self, expert_ram: usize) -> anyhow::Result<SpineOptions> {
        let choice = match self.spine.as_str() {
            "auto" => SpineChoice::Auto,
            "int8" => SpineChoice::Int8,
            "bf16" => SpineChoice::Bf16,
            other => anyhow::bail!("--spine {other}: use auto, int8 or bf16"),
        };
        let resident_bytes = match self.spine_resident_gb {
            Some(gb) if gb >= 0.0 && gb.is_finite() => (gb * 1e9) as u64,
            Some(_) => anyhow::bail!("--spine-resident-gb must be a non-negative number"),
            None => {
                let mem = Memory::read();
                // Fixed costs: the expert RAM tier plus a margin for state and activations.
                let fixed = expert_ram as u64 + 1_000_000_000;
                let b = resident_budget(&mem, fixed);
                tracing::info!(
                    total = mem.effective_total(),
                    reserve = reserve(&mem),
                    fixed,
                    budget = b,
                    "spine RAM budget"
                );
                b
            }
        };
        Ok(SpineOptions {
            choice,
            resident_bytes: Some(resident_bytes),
            ..Default::default()
        })
    }
}

/// Loads the model with the store settings and prints the startup report on stderr.
pub fn load_model(root: &std::path::Path, store: &StoreArgs) -> anyhow::Result<K3Model> {
    let (opts, cache) = store.build()?;
    let spine = store.spine_options(opts.ram_budget)?;
    let model = K3Model::from_dir_with(root, &candle::Device::Cpu, &opts, cache, &spine)?;
    let r = model.spine().report();
    eprintln!(
        "spine: {} from {}; {} layers pinned ({:.2} GB), {} streamed; spine bytes read per token: {:.2} GB",
        r.format.dir_name(),
        if r.from_store { "the converted store" } else { "the checkpoint shards" },
        r.layers_pinned,
        r.resident_bytes as f64 / 1e9,
        r.layers_streamed,
        r.bytes_read_per_token as f64 / 1e9
    );
    Ok(model)
}

/// Arguments of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Model directory: a plain checkpoint as the hub serves it, or an installed model root.
    #[arg(long)]
    pub model_root: PathBuf,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub prompt_ids: Vec<u32>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 16)]
    pub max_new: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print per-token expert statistics (tiers, bytes, wait, prefetch hits) on stderr.
    #[arg(long)]
    pub stats: bool,
    /// Write the router trace (one JSON line per token) here; `K3_TRACE=buffered` writes
    /// `router_trace.jsonl` in the current directory.
    #[arg(long)]
    pub router_trace: Option<PathBuf>,
    /// Expert store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

fn stats_line(i: usize, s: &ExpertStats) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    format!(
        "token {i}: ram {} | prefetch hits {} | disk {} ({:.1} MB) | shards {} ({:.1} MB) | hub {} ({:.1} MB, {} requests) | wait {:.2} ms",
        s.ram_experts,
        s.prefetch_hits,
        s.disk_experts,
        mb(s.disk_bytes),
        s.shard_experts,
        mb(s.shard_bytes),
        s.hub_experts,
        mb(s.hub_bytes),
        s.hub_requests,
        s.read_wait_s * 1e3
    )
}

/// Runs `deltafin run`.
pub fn run(a: &RunArgs) -> anyhow::Result<()> {
    let mut model = load_model(&a.model_root, &a.store)?;
    model.router_trace = match &a.router_trace {
        Some(p) => Some(RouterTrace::create(p)?),
        None => RouterTrace::from_env(&std::env::current_dir()?)?,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        // A second Ctrl-C while stopping exits at once.
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let gen_opts = GenerateOptions {
        max_new: a.max_new,
        stop_ids: vec![model.config().eos_token_id],
    };
    let mut state = model.new_state();
    let mut last = model.expert_stats().unwrap_or_default();
    let mut i = 0;
    let gen =
        Generator::new(&model).generate(&mut state, &a.prompt_ids, &gen_opts, &cancel, |id| {
            if a.stats {
                let now = model.expert_stats().unwrap_or_default();
                eprintln!("{}", stats_line(i, &now.since(&last)));
                last = now;
            }
            if !a.json && !a.stats {
                eprint!("{id} ");
            }
            i += 1;
        })?;
    if let Some(rt) = &model.router_trace {
        rt.flush()?;
    }
    let steps = gen.generated_ids.len().saturating_sub(1).max(1);
    if a.json {
        let v = serde_json::json!({
            "prompt_ids": gen.prompt_ids,
            "generated_ids": gen.generated_ids,
            "first_step_top": gen.first_step_top.iter().map(|(i, l)| serde_json::json!([i, l])).collect::<Vec<_>>(),
            "stop": gen.stop,
        });
        println!("{v}");
    } else {
        eprintln!();
        println!(
            "{}",
            gen.generated_ids
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        eprintln!(
            "stop: {:?}; prefill {:.1} ms ({} tokens), decode {:.2} ms/token",
            gen.stop,
            gen.prefill_ms,
            a.prompt_ids.len(),
            gen.decode_ms / steps as f64
        );
    }
    if a.stats {
        if let Some(s) = model.expert_stats() {
            eprintln!("total: {}", serde_json::to_string(&s)?);
        }
    }
    Ok(())
}
