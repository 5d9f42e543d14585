//! The `deltafin` command line (clap), a thin layer over the library.

pub mod doctor;
pub mod events;
pub mod install;
pub mod run;
pub mod store;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use deltafin::checkpoint::fixture::{write_k3_full, write_nano, write_slice, NanoOptions};
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::mxfp4::Kernel;
use deltafin::K3Config;

/// Kimi K3 on one machine: streamed MXFP4 experts on Candle.
#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a test/benchmark checkpoint in K3's exact on-disk format.
    Fixture {
        /// Which fixture.
        #[command(subcommand)]
        kind: FixtureKind,
    },
    /// Print the inventory of a checkpoint directory (tensors, shards, expert spans).
    Inventory {
        /// Model directory.
        dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Install K3 from the hub: full (every shard) or streaming (spine now, experts on demand).
    Setup(install::SetupArgs),
    /// Fetch a streaming install's missing experts (resumable).
    FetchExperts(install::FetchArgs),
    /// Rank absent experts by how often router traces selected them; fetch with --fetch N.
    WarmCache(install::WarmArgs),
    /// Serve a local model directory over the Hugging Face protocol (for trying `setup` offline).
    MockHub {
        /// Directory to serve (e.g. a K3-nano fixture).
        dir: PathBuf,
        /// Repository id it answers to.
        #[arg(long, default_value = "moonshotai/Kimi-K3-nano")]
        repo: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: String,
    },
    /// OpenAI-compatible server (`/v1/models`, `/v1/chat/completions`, `/v1/completions`).
    Serve(run::ServeArgs),
    /// Generate from a prompt (text, chat, or token ids).
    Run(run::RunArgs),
    /// Check this machine and (with --model-root) an installed model: ok / warn / FAIL lines.
    Doctor(doctor::DoctorArgs),
    /// Convert the spine to row-int8 (resumable; the model then uses it automatically).
    ConvertSpineInt8 {
        /// Model directory (a plain checkpoint or an installed model root).
        #[arg(long)]
        model_root: PathBuf,
    },
    /// Write the BF16 spine store (one sequential read per layer; the original bytes).
    ConvertSpine {
        /// Model directory.
        #[arg(long)]
        model_root: PathBuf,
    },
    /// Benchmarks.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        kind: BenchKind,
    },
}

/// Fixture kinds.
#[derive(Debug, Subcommand)]
pub enum FixtureKind {
    /// K3-nano: tiny, complete, every structural feature of K3.
    Nano {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of shards.
        #[arg(long, default_value_t = 4)]
        shards: usize,
        /// Scatter each expert's six tensors through the layer's run (not one read).
        #[arg(long)]
        scattered_experts: bool,
    },
    /// K3-slice: real K3 per-layer dimensions, few layers and experts (several GB).
    Slice {
        /// Output directory.
        dir: PathBuf,
        /// Decoder layers.
        #[arg(long, default_value_t = 4)]
        layers: usize,
        /// Routed experts per MoE layer.
        #[arg(long, default_value_t = 32)]
        experts: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// K3's full shape (real config, 96 shards, 82,432 experts at real sizes), written as sparse
    /// files: about 1.3 GB of disk for 1.56 TB of checkpoint. Outputs are meaningless.
    #[command(name = "k3-full")]
    K3Full {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Cold spine layer loads (BF16 and int8) vs raw reads, and the share hidden by read-ahead.
    Spine {
        /// Model directory (the K3-slice fixture; the spine stores are converted if missing).
        #[arg(long)]
        model_root: PathBuf,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Cold expert reads through the tiered store vs raw O_DIRECT sequential reads (K3-slice).
    Experts {
        /// Model directory (the K3-slice fixture).
        #[arg(long)]
        model_root: PathBuf,
        /// Experts read per layer.
        #[arg(long, default_value_t = 16)]
        per_layer: usize,
        /// Reader thread counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        readers: Vec<usize>,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Prefill and decode speed of the whole model (each KDA form).
    Forward {
        /// Model directory.
        #[arg(long)]
        model_root: PathBuf,
        /// Prompt length.
        #[arg(long, default_value_t = 64)]
        prompt_len: usize,
        /// Decode steps per run.
        #[arg(long, default_value_t = 32)]
        decode: usize,
        /// Timed runs (after one warm-up run).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Compute device: auto, cpu or metal.
        #[arg(long, value_enum, default_value = "auto")]
        device: deltafin::compute::device::DeviceChoice,
        /// Instead: time one MLA layer's decode step with this many positions cached (and what
        /// the step allocates), for each value, comma-separated.
        #[arg(long, value_delimiter = ',')]
        context: Vec<usize>,
        /// Instead: per decode token, compute (attention, MoE), spine and expert wait, bytes
        /// read, and the floor of the same work at the bandwidths measured in the same run.
        #[arg(long)]
        breakdown: bool,
    },
    /// Spine GEMV (row-int8 and BF16, one input row) on K3-size matrices vs the measured memory
    /// read bandwidth.
    Dense {
        /// GB of matrices per format.
        #[arg(long, default_value_t = 1.0)]
        gb: f64,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Thread counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
    },
    /// Fused MXFP4 GEMV on K3-size expert matrices vs the measured memory read bandwidth.
    Mxfp4 {
        /// K3-size experts in the working set (17.55 MB each).
        #[arg(long, default_value_t = 64)]
        experts: usize,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Kernel: scalar, avx2, avx512, neon (default: best available).
        #[arg(long)]
        kernel: Option<String>,
        /// Thread counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
    },
}

fn parse_kernel(s: &str) -> anyhow::Result<Kernel> {
    Ok(match s {
        "scalar" => Kernel::Scalar,
        "avx2" => Kernel::Avx2,
        "avx512" => Kernel::Avx512,
        "neon" => Kernel::Neon,
        _ => anyhow::bail!("unknown kernel `{s}` (scalar, avx2, avx512, neon)"),
    })
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fixture { kind } => match kind {
            FixtureKind::Nano {
                dir,
                seed,
                shards,
                scattered_experts,
            } => {
                let opts = NanoOptions {
                    seed,
                    shards,
                    contiguous_experts: !scattered_experts,
                };
                write_nano(&dir, &opts)?;
                eprintln!("wrote K3-nano to {}", dir.display());
            }
            FixtureKind::Slice {
                dir,
                layers,
                experts,
                seed,
            } => {
                write_slice(&dir, layers, experts, seed)?;
                eprintln!(
                    "wrote K3-slice ({layers} layers, {experts} experts) to {}",
                    dir.display()
                );
            }
            FixtureKind::K3Full { dir, seed } => {
                let t0 = std::time::Instant::now();
                write_k3_full(&dir, seed)?;
                eprintln!(
                    "wrote the full-shape K3 fixture (sparse) to {} in {:.1} s",
                    dir.display(),
                    t0.elapsed().as_secs_f64()
                );
            }
        },
        Command::Inventory { dir, json } => {
            let cfg = K3Config::from_file(&dir.join("config.json"))?;
            let inv = Inventory::from_dir(&dir)?;
            let ex = ExpertIndex::derive_k3(&inv, &cfg)?;
            let summary = serde_json::json!({
                "shards": inv.shards.iter().map(|s| &s.file).collect::<Vec<_>>(),
                "tensors": inv.len(),
                "skipped_vision_tensors": inv.skipped,
                "experts": ex.count(),
                "contiguous_experts": ex.contiguous_count(),
                "expert_span_bytes": ex.layout.span_bytes(),
                "layers": cfg.num_layers(),
                "moe_layers": cfg.moe_layers().count(),
            });
            if json {
                println!("{summary}");
            } else {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            }
        }
        Command::Run(a) => run::run(&a)?,
        Command::Doctor(a) => doctor::run(&a)?,
        Command::Serve(a) => run::serve(&a)?,
        Command::Setup(a) => install::run_setup(&a)?,
        Command::MockHub { dir, repo, listen } => {
            let hub = deltafin::hub::mock::MockHub::start_on(&dir, &repo, &listen)?;
            eprintln!(
                "serving {} as {repo} at {} (set HF_ENDPOINT to it); Ctrl-C stops",
                dir.display(),
                hub.endpoint()
            );
            hub.wait();
        }
        Command::FetchExperts(a) => install::run_fetch(&a)?,
        Command::WarmCache(a) => install::run_warm(&a)?,
        Command::ConvertSpineInt8 { model_root } => {
            convert(&model_root, deltafin::spine::convert::SpineFormat::Int8)?
        }
        Command::ConvertSpine { model_root } => {
            convert(&model_root, deltafin::spine::convert::SpineFormat::Bf16)?
        }
        Command::Bench { kind } => match kind {
            BenchKind::Spine { model_root, runs } => {
                crate::bench::spine::spine_bench(&model_root, runs, |l| println!("{l}"))?;
            }
            BenchKind::Experts {
                model_root,
                per_layer,
                readers,
                runs,
            } => {
                let opts = crate::bench::experts::ExpertsBenchOptions {
                    per_layer,
                    readers,
                    runs,
                };
                crate::bench::experts::experts_bench(&model_root, &opts, |l| println!("{l}"))?;
            }
            BenchKind::Forward {
                model_root,
                prompt_len,
                decode,
                runs,
                device,
                context,
                breakdown,
            } => {
                let device = deltafin::compute::device::select(device)?;
                println!("device={}", deltafin::compute::device::describe(&device));
                let mut model =
                    deltafin::K3Model::open_with(&model_root, &device, &Default::default(), |p| {
                        eprintln!("{p}")
                    })?;
                if !context.is_empty() {
                    let most = context.iter().max().copied().unwrap_or(0);
                    model.set_context_limit(most + runs + 2);
                    return crate::bench::forward::context_bench(&model, &context, runs, |l| {
                        println!("{l}")
                    })
                    .map_err(Into::into);
                }
                if breakdown {
                    return crate::bench::forward::breakdown_bench(
                        &mut model,
                        &model_root,
                        prompt_len.max(1),
                        decode,
                        runs,
                        |l| println!("{l}"),
                    )
                    .map_err(Into::into);
                }
                let opts = crate::bench::ForwardBenchOptions {
                    prompt_len: prompt_len.max(1),
                    decode,
                    runs,
                };
                crate::bench::forward_bench(&mut model, &opts, |l| println!("{l}"))?;
            }
            BenchKind::Dense { gb, runs, threads } => {
                let threads: Vec<usize> = threads.into_iter().filter(|&t| t > 0).collect();
                if threads.is_empty() || !(gb > 0.0 && gb.is_finite()) {
                    anyhow::bail!("--threads needs a positive count and --gb a positive size");
                }
                let opts = crate::bench::dense::DenseBenchOptions {
                    working_set: (gb * 1e9) as usize,
                    runs: runs.max(1),
                    threads,
                };
                crate::bench::dense::dense_bench(&opts, |line| println!("{line}"))?;
            }
            BenchKind::Mxfp4 {
                experts,
                runs,
                kernel,
                threads,
            } => {
                let threads: Vec<usize> = threads.into_iter().filter(|&t| t > 0).collect();
                if threads.is_empty() {
                    anyhow::bail!("--threads needs at least one positive count");
                }
                let mut opts = crate::bench::Mxfp4BenchOptions {
                    experts,
                    runs: runs.max(1),
                    threads,
                    ..Default::default()
                };
                if let Some(k) = kernel {
                    opts.kernel = parse_kernel(&k)?;
                }
                crate::bench::mxfp4_bench(&opts, |line| println!("{line}"))?;
            }
        },
    }
    Ok(())
}

fn convert(
    root: &std::path::Path,
    format: deltafin::spine::convert::SpineFormat,
) -> anyhow::Result<()> {
    let cfg = K3Config::from_file(&root.join("config.json"))?;
    let inv = Inventory::from_dir(root)?;
    let bar = indicatif::ProgressBar::new((cfg.num_layers() + 2) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "converting spine [{bar:30}] {pos}/{len} files, eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    use deltafin::spine::convert::{convert_spine, convert_spine_from, store_dir, SpineFormat};
    let n = cfg.num_layers();
    let local_shards = inv.shards.iter().all(|s| root.join(&s.file).is_file());
    let bf16 = store_dir(root, SpineFormat::Bf16);
    let fp = deltafin::checkpoint::Source::of(&inv).fingerprint();
    let bf16_complete = deltafin::spine::convert::store_state(root, SpineFormat::Bf16, n, &fp)
        == deltafin::spine::convert::StoreState::Current;
    if !local_shards && !bf16_complete {
        anyhow::bail!(
            "{} has no shards and its BF16 spine store is not complete for this checkpoint ({}): re-run `deltafin setup` to (re)build it",
            root.display(),
            bf16.display()
        );
    }
    let dir = if !local_shards && format == SpineFormat::Int8 && bf16_complete {
        // A streaming install has no shards: its BF16 store holds the original bytes.
        let src = deltafin::spine::convert::StoreTensors::new(bf16, &inv);
        convert_spine_from(&src, &inv, n, root, format, |done, _| {
            bar.set_position(done as u64)
        })?
    } else {
        convert_spine(&inv, n, root, format, |done, _| {
            bar.set_position(done as u64)
        })?
    };
    bar.finish_and_clear();
    eprintln!("spine ({}) written to {}", format.dir_name(), dir.display());
    Ok(())
}
