//! The `deltafin` command line (clap), a thin layer over the library.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::checkpoint::fixture::{write_nano, write_slice, NanoOptions};
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::mxfp4::Kernel;
use crate::K3Config;

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
    /// Generate greedily from token ids and print the result.
    Run {
        /// Model directory: a plain checkpoint as the hub serves it, or an installed model root.
        #[arg(long)]
        model_root: PathBuf,
        /// Prompt token ids, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        prompt_ids: Vec<u32>,
        /// Most tokens to generate.
        #[arg(long, default_value_t = 16)]
        max_new: usize,
        /// Print one JSON object on stdout.
        #[arg(long)]
        json: bool,
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
}

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchKind {
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
        Command::Run {
            model_root,
            prompt_ids,
            max_new,
            json,
        } => run_ids(&model_root, &prompt_ids, max_new, json)?,
        Command::Bench { kind } => match kind {
            BenchKind::Forward {
                model_root,
                prompt_len,
                decode,
                runs,
            } => {
                let mut model = crate::K3Model::from_dir(&model_root, &candle::Device::Cpu)?;
                let opts = crate::bench::ForwardBenchOptions {
                    prompt_len: prompt_len.max(1),
                    decode,
                    runs,
                };
                crate::bench::forward_bench(&mut model, &opts, |l| println!("{l}"))?;
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

fn run_ids(
    root: &std::path::Path,
    prompt: &[u32],
    max_new: usize,
    json: bool,
) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let model = crate::K3Model::from_dir(root, &candle::Device::Cpu)?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        // A second Ctrl-C while stopping falls through to the default handler's exit.
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let opts = crate::GenerateOptions {
        max_new,
        stop_ids: vec![model.config().eos_token_id],
    };
    let mut state = model.new_state();
    let gen = crate::Generator::new(&model).generate(&mut state, prompt, &opts, &cancel, |id| {
        if !json {
            eprint!("{id} ");
        }
    })?;
    let steps = gen.generated_ids.len().saturating_sub(1).max(1);
    tracing::info!(
        prefill_ms = gen.prefill_ms,
        decode_ms_per_token = gen.decode_ms / steps as f64,
        "generation finished"
    );
    if json {
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
            prompt.len(),
            gen.decode_ms / steps as f64
        );
    }
    Ok(())
}
