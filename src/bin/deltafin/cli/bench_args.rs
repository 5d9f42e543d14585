//! `deltafin bench ...`: the benchmark subcommands and their dispatch to `crate::bench`.

use std::path::PathBuf;

use clap::Subcommand;

use deltafin::mxfp4::Kernel;

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
    /// Expert wait per token with 1, 2, 4 … emulated storage homes of equal rate vs the ideal.
    Homes {
        /// Model directory (the K3-slice fixture).
        #[arg(long)]
        model_root: PathBuf,
        /// Home counts, comma-separated (the first is the baseline).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        homes: Vec<usize>,
        /// Emulated rate of each home in MB/s.
        #[arg(long, default_value_t = 400.0)]
        rate_mb: f64,
        /// Tokens per run.
        #[arg(long, default_value_t = 4)]
        tokens: usize,
        /// Timed runs.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Scratch directory for the homes (hard links of one populated home; removed after).
        #[arg(long, default_value = "/tmp/deltafin-bench-homes")]
        scratch: PathBuf,
    },
    /// A prompt's prefill, layer-major against the old chunk-major order: bytes read ÷ the
    /// distinct weight bytes it needs, wall time ÷ max(I/O, compute floor), peak RSS vs the plan.
    Prefill {
        /// Model directory (a full-shape fixture or a layer prefix of one).
        #[arg(long)]
        model_root: PathBuf,
        /// Prompt lengths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "64,512,4096")]
        lengths: Vec<usize>,
        /// Runs per order and length (each on a freshly opened model).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Draw prompt ids below this (default: the vocabulary; the full-shape fixture's
        /// embedding holds data in its first 4,096 rows).
        #[arg(long)]
        id_max: Option<u32>,
        /// Layer-major only (skip the chunk-major comparison).
        #[arg(long)]
        no_chunk_major: bool,
        /// Memory limit in GB (default: the machine's).
        #[arg(long)]
        memory_gb: Option<f64>,
    },
    /// A multi-turn agent transcript (a long system prompt, two clients interleaved, an edited
    /// turn, a restart) with and without the prompt cache: time to first token, tokens
    /// prefilled, bytes read per request; one K3-shape snapshot saved and loaded vs the disk.
    PromptCache {
        /// Model directory (K3-tiny by default; a full-shape layer prefix works too).
        #[arg(long)]
        model_root: Option<PathBuf>,
        /// Tokens of the system prompt.
        #[arg(long, default_value_t = 2000)]
        system_tokens: usize,
        /// Turns, alternating between two clients (then one edited turn, then a restart).
        #[arg(long, default_value_t = 8)]
        turns: usize,
        /// Tokens generated per reply.
        #[arg(long, default_value_t = 8)]
        reply: usize,
        /// Memory limit in GB (default: the machine's).
        #[arg(long)]
        memory_gb: Option<f64>,
        /// Scratch directory (cache files, snapshot files; removed after).
        #[arg(long, default_value = "/tmp/deltafin-bench-prompt-cache")]
        scratch: PathBuf,
        /// Skip the K3-shape snapshot save/load figure.
        #[arg(long)]
        no_snapshot: bool,
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
        /// Instead: per decode token, wall time against the I/O floor (bytes from storage ÷
        /// the raw parallel O_DIRECT read rate) and the compute floor (bytes the kernels touch ÷
        /// memory read bandwidth), both measured before each run; median of per-run ratios.
        #[arg(long)]
        floor: bool,
        /// Instead: ms per emitted token with speculative decoding on (`--spec-mode`) and off,
        /// interleaved, on a repetitive and a non-repetitive prompt (or `--text` prompts), with
        /// tokens per pass and acceptance; fails if the outputs differ.
        #[arg(long)]
        speculate: bool,
        /// With `--speculate`: the mode measured against off (auto or ngram).
        #[arg(long, default_value = "auto")]
        spec_mode: deltafin::generate::SpecMode,
        /// With `--speculate`: most drafts per pass.
        #[arg(long, default_value_t = 8)]
        spec_depth: usize,
        /// With `--speculate`: prompts from this text file instead (up to 10 windows of
        /// `--prompt-len` tokens, spread over the file; needs the model's tokenizer).
        #[arg(long)]
        text: Option<PathBuf>,
        /// Pin no spine layer (every layer streamed through the template buffers).
        #[arg(long)]
        stream_spine: bool,
        /// Drop the model's files from the page cache at the start of every pass (reads come
        /// from the disk, as on a machine smaller than the model).
        #[arg(long)]
        cold_spine: bool,
        /// With `--speculate`: also time the plain run's own continuation as drafts (every
        /// draft right; the bound of the verify pass, not a drafter).
        #[arg(long)]
        oracle_drafts: bool,
    },
    /// Concurrent streams through the batch scheduler: aggregate tokens/s, per-request ms per
    /// token (median, p95), spine and expert bytes per emitted token for each batch size, the
    /// ratio to one stream beside the byte formula's, and the decode gaps a newcomer's
    /// interleaved prefill adds.
    Serve {
        /// Model directory (default: the built-in K3-tiny).
        #[arg(long)]
        model_root: Option<PathBuf>,
        /// Concurrent streams to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        batches: Vec<usize>,
        /// Prompt tokens per stream.
        #[arg(long, default_value_t = 16)]
        prompt_len: usize,
        /// Tokens decoded per stream.
        #[arg(long, default_value_t = 8)]
        decode: usize,
        /// Timed runs per batch size (interleaved).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Pin no spine layer (every layer streamed through the template buffers).
        #[arg(long)]
        stream_spine: bool,
        /// Drop the model's files from the page cache at every pass, no expert RAM tier:
        /// every byte from the disk, as on a machine smaller than the model.
        #[arg(long)]
        cold_spine: bool,
        /// Prompt tokens of the newcomer whose prefill is interleaved with two decoding
        /// streams (0: skip that figure).
        #[arg(long, default_value_t = 512)]
        interleave_prompt: usize,
        /// Prompt tokens per pass beside the decode rows (the server's --prefill-tokens).
        #[arg(long, default_value_t = 256)]
        prefill_tokens: usize,
        /// Draw prompt ids below this (the full-shape fixture's data rows: 4096).
        #[arg(long)]
        id_max: Option<u32>,
    },
    /// Spine GEMV (row-int8 and BF16, one input row or several) on K3-size matrices vs the
    /// measured memory read bandwidth.
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
        /// Input rows per call (1: decode; more: a batched pass), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        rows: Vec<usize>,
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

/// Runs one benchmark, printing its JSON lines on stdout.
pub fn run(kind: BenchKind) -> anyhow::Result<()> {
    match kind {
        BenchKind::Prefill {
            model_root,
            lengths,
            runs,
            id_max,
            no_chunk_major,
            memory_gb,
        } => {
            let load = deltafin::engine::LoadOptions {
                memory_limit: memory_gb.map(|g| (g * 1e9) as u64),
                ..Default::default()
            };
            let o = crate::bench::prefill::PrefillBenchOptions {
                lengths: lengths.into_iter().filter(|&n| n > 0).collect(),
                runs,
                id_max,
                chunk_major: !no_chunk_major,
            };
            crate::bench::prefill::prefill_bench(
                &model_root,
                &candle::Device::Cpu,
                &load,
                &o,
                |l| println!("{l}"),
            )?;
        }
        BenchKind::PromptCache {
            model_root,
            system_tokens,
            turns,
            reply,
            memory_gb,
            scratch,
            no_snapshot,
        } => {
            let root = match model_root {
                Some(r) => r,
                None => deltafin::assets::k3_tiny()?,
            };
            let o = crate::bench::prompt_cache::PromptCacheBenchOptions {
                system_tokens,
                turns,
                reply,
                memory_limit: memory_gb.map(|g| (g * 1e9) as u64),
                scratch,
                no_snapshot,
            };
            crate::bench::prompt_cache::prompt_cache_bench(&root, &o, |l| println!("{l}"))?;
        }
        BenchKind::Serve {
            model_root,
            batches,
            prompt_len,
            decode,
            runs,
            stream_spine,
            cold_spine,
            interleave_prompt,
            prefill_tokens,
            id_max,
        } => {
            let root = match model_root {
                Some(r) => r,
                None => deltafin::assets::k3_tiny()?,
            };
            let most = batches.iter().copied().max().unwrap_or(1);
            let mut load = deltafin::engine::LoadOptions {
                resident_cap: stream_spine.then_some(0),
                expert_ram: cold_spine.then_some(0),
                direct_spine: cold_spine.then_some(true),
                max_batch: Some(most.max(3)),
                ..Default::default()
            };
            // Bytes per token count what the batch itself reads, not guesses read ahead.
            load.store.prefetch_previous = false;
            let engine = deltafin::Engine::open_with(
                &root,
                &deltafin::EngineOptions {
                    load,
                    ..Default::default()
                },
                |p| eprintln!("{p}"),
            )?;
            let o = crate::bench::serve::ServeBenchOptions {
                batches: batches.into_iter().filter(|&b| b > 0).collect(),
                prompt_len: prompt_len.max(1),
                decode: decode.max(2),
                runs,
                cold: cold_spine,
                interleave_prompt,
                prefill_tokens: prefill_tokens.max(1),
                id_max,
            };
            crate::bench::serve::serve_bench(engine, &root, &o, |l| println!("{l}"))?;
        }
        BenchKind::Spine { model_root, runs } => {
            crate::bench::spine::spine_bench(&model_root, runs, |l| println!("{l}"))?;
        }
        BenchKind::Homes {
            model_root,
            homes,
            rate_mb,
            tokens,
            runs,
            scratch,
        } => {
            if homes.is_empty() || homes.contains(&0) || rate_mb.is_nan() || rate_mb <= 0.0 {
                anyhow::bail!("--homes needs positive counts and --rate-mb a positive rate");
            }
            let o = crate::bench::homes::HomesBenchOptions {
                homes,
                rate: rate_mb * 1e6,
                tokens: tokens.max(1),
                runs: runs.max(1),
                scratch,
            };
            crate::bench::homes::homes_bench(&model_root, &o, |l| println!("{l}"))?;
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
            floor,
            speculate,
            spec_mode,
            spec_depth,
            text,
            stream_spine,
            cold_spine,
            oracle_drafts,
        } => {
            let device = deltafin::compute::device::select(device)?;
            println!("device={}", deltafin::compute::device::describe(&device));
            let load = deltafin::engine::LoadOptions {
                resident_cap: stream_spine.then_some(0),
                // `--floor --cold-spine`: experts cold too (no RAM tier to hit).
                expert_ram: (floor && cold_spine).then_some(0),
                // Cold: as on a machine whose page cache cannot hold the streamed layers.
                direct_spine: cold_spine.then_some(true),
                ..Default::default()
            };
            let mut model =
                deltafin::K3Model::open_with(&model_root, &device, &load, |p| eprintln!("{p}"))?;
            if speculate {
                let vocab = model.config().text().vocab_size as u32;
                let len = prompt_len.max(2);
                let prompts = match &text {
                    Some(t) => text_prompts(&model_root, t, len)?,
                    None => crate::bench::speculate::synthetic_prompts(vocab, len),
                };
                let o = crate::bench::speculate::SpecBenchOptions {
                    decode: decode.max(2),
                    runs,
                    spec: deltafin::generate::Speculation {
                        mode: spec_mode,
                        depth: spec_depth.clamp(1, deltafin::generate::spec::MAX_DEPTH),
                    },
                    prompts,
                    cold: cold_spine,
                    oracle: oracle_drafts,
                };
                return crate::bench::speculate::spec_bench(&mut model, &model_root, &o, |l| {
                    println!("{l}")
                })
                .map_err(Into::into);
            }
            if !context.is_empty() {
                let most = context.iter().max().copied().unwrap_or(0);
                model.set_context_limit(most + runs + 2);
                return crate::bench::forward::context_bench(&model, &context, runs, |l| {
                    println!("{l}")
                })
                .map_err(Into::into);
            }
            if floor {
                let o = crate::bench::floor::FloorOptions {
                    prompt_len,
                    decode,
                    runs,
                    cold: cold_spine,
                };
                return crate::bench::floor::floor_bench(&mut model, &model_root, &o, |l| {
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
        BenchKind::Dense {
            gb,
            runs,
            threads,
            rows,
        } => {
            let threads: Vec<usize> = threads.into_iter().filter(|&t| t > 0).collect();
            let rows: Vec<usize> = rows.into_iter().filter(|&t| t > 0).collect();
            if threads.is_empty() || !(gb > 0.0 && gb.is_finite()) {
                anyhow::bail!("--threads needs a positive count and --gb a positive size");
            }
            let opts = crate::bench::dense::DenseBenchOptions {
                working_set: (gb * 1e9) as usize,
                runs: runs.max(1),
                threads,
                rows: if rows.is_empty() { vec![1] } else { rows },
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
    }
    Ok(())
}

/// Up to 10 prompts of `len` tokens spread over a text file, tokenised with the model's
/// tokenizer.
fn text_prompts(
    root: &std::path::Path,
    text: &std::path::Path,
    len: usize,
) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
    let tok = deltafin::tokenizer::Tokenizer::from_dir(root)?;
    let s = std::fs::read_to_string(text)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", text.display()))?;
    let ids = tok.encode_ordinary(&s);
    if ids.len() < len {
        anyhow::bail!(
            "{} holds {} tokens, fewer than --prompt-len {len}",
            text.display(),
            ids.len()
        );
    }
    let n = 10.min(ids.len() / len);
    Ok((0..n)
        .map(|i| {
            let at = (ids.len() - len) * i / n.max(1);
            (format!("text_{i}"), ids[at..at + len].to_vec())
        })
        .collect())
}
