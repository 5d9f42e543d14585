//! `deltafin-k3`: K3's own tools, in K3's folder so that the `deltafin` binary names no family.
//! Training K3-tiny (`train`, `train-tokenizer`), the fp32-vs-inference comparison of a
//! training run (`compare-fp32`), and the benchmarks of K3's internals (`bench spine`,
//! `experts`, `homes`, `prefill`, `prompt-cache`, `forward`). Everything a user runs on a model
//! (run, serve, setup, plan, bench forward --floor/--speculate, bench serve) is `deltafin`'s.
//! The library knows nothing of this binary; it is a thin layer over `deltafin::models::k3`.

use std::path::PathBuf;

use clap::Parser;

mod args;
mod experts;
mod forward;
mod homes;
mod mapped;
mod prefill;
mod prompt_cache;
#[path = "../../../bin/deltafin/cli/reference.rs"]
mod reference;
mod spine;
mod train;

use args::{BenchKind, Cli, Command};
use deltafin::models::k3::K3Model;

// Counts live bytes so `bench forward --context` can report what one step allocates.
#[global_allocator]
static ALLOC: deltafin::alloc_count::CountingAlloc = deltafin::alloc_count::CountingAlloc;

fn main() -> anyhow::Result<()> {
    deltafin::init(std::env::var_os("RAYON_NUM_THREADS").is_some());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::TrainTokenizer { text, vocab, out } => train_tokenizer(&text, vocab, &out),
        Command::Train(a) => train::run(&a),
        Command::CompareFp32(a) => train::compare_fp32(&a),
        Command::Bench { kind } => bench(kind),
        Command::CliReference => {
            print!(
                "{}",
                reference::markdown(<Cli as clap::CommandFactory>::command())
            );
            Ok(())
        }
    }
}

/// `train-tokenizer`: ranks with K3's split pattern, written in K3's tokenizer files.
fn train_tokenizer(text: &[PathBuf], vocab: usize, out: &std::path::Path) -> anyhow::Result<()> {
    use deltafin::checkpoint::tiktoken_fixture::{tiktoken_model_text, tokenizer_config_json};
    let t0 = std::time::Instant::now();
    let files: Vec<&std::path::Path> = text.iter().map(|p| p.as_path()).collect();
    let ranks = deltafin::tokenizer::train::train_ranks(
        &files,
        vocab,
        deltafin::tokenizer::TIKTOKEN_PATTERN,
    )?;
    std::fs::create_dir_all(out)?;
    let model = out.join("tiktoken.model");
    deltafin::fsio::atomic::write_atomic(&model, tiktoken_model_text(&ranks).as_bytes())?;
    let cfg = serde_json::to_vec_pretty(&tokenizer_config_json(ranks.len() as u32))?;
    deltafin::fsio::atomic::write_atomic(&out.join("tokenizer_config.json"), &cfg)?;
    // The files load as the model's tokenizer does.
    deltafin::tokenizer::Tokenizer::from_dir(out)?;
    eprintln!(
        "trained {} ranks in {:.1} s; wrote {}",
        ranks.len(),
        t0.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// Runs one benchmark, printing its JSON lines on stdout.
fn bench(kind: BenchKind) -> anyhow::Result<()> {
    match kind {
        BenchKind::Prefill {
            model_root,
            lengths,
            runs,
            id_max,
            no_chunk_major,
            memory_gb,
        } => {
            let load = deltafin::runtime::load::LoadOptions {
                memory_limit: memory_gb.map(|g| (g * 1e9) as u64),
                ..Default::default()
            };
            let o = crate::prefill::PrefillBenchOptions {
                lengths: lengths.into_iter().filter(|&n| n > 0).collect(),
                runs,
                id_max,
                chunk_major: !no_chunk_major,
            };
            crate::prefill::prefill_bench(&model_root, &candle::Device::Cpu, &load, &o, |l| {
                println!("{l}")
            })?;
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
            let o = crate::prompt_cache::PromptCacheBenchOptions {
                system_tokens,
                turns,
                reply,
                memory_limit: memory_gb.map(|g| (g * 1e9) as u64),
                scratch,
                no_snapshot,
            };
            crate::prompt_cache::prompt_cache_bench(&root, &o, |l| println!("{l}"))?;
        }
        BenchKind::Spine { model_root, runs } => {
            crate::spine::spine_bench(&model_root, runs, |l| println!("{l}"))?;
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
            let o = crate::homes::HomesBenchOptions {
                homes,
                rate: rate_mb * 1e6,
                tokens: tokens.max(1),
                runs: runs.max(1),
                scratch,
            };
            crate::homes::homes_bench(&model_root, &o, |l| println!("{l}"))?;
        }
        BenchKind::Experts {
            model_root,
            per_layer,
            readers,
            runs,
        } => {
            let opts = crate::experts::ExpertsBenchOptions {
                per_layer,
                readers,
                runs,
            };
            crate::experts::experts_bench(&model_root, &opts, |l| println!("{l}"))?;
        }
        BenchKind::Forward {
            model_root,
            prompt_len,
            decode,
            runs,
            device,
            context,
            breakdown,
            stream_spine,
            cold_spine,
        } => {
            let device = deltafin::compute::device::select(device)?;
            println!("device={}", deltafin::compute::device::describe(&device));
            let load = deltafin::runtime::load::LoadOptions {
                resident_cap: stream_spine.then_some(0),
                direct_spine: cold_spine.then_some(true),
                ..Default::default()
            };
            let mut model = K3Model::open_with(&model_root, &device, &load, |p| eprintln!("{p}"))?;
            let emit = |l: serde_json::Value| println!("{l}");
            if !context.is_empty() {
                let most = context.iter().max().copied().unwrap_or(0);
                model.set_context_limit(most + runs + 2);
                forward::context_bench(&model, &context, runs, emit)?;
            } else if breakdown {
                forward::breakdown_bench(
                    &mut model,
                    &model_root,
                    prompt_len.max(1),
                    decode,
                    runs,
                    emit,
                )?;
            } else {
                let opts = deltafin::measure::forward::ForwardBenchOptions {
                    prompt_len: prompt_len.max(1),
                    decode,
                    runs,
                };
                forward::forward_bench(&mut model, &opts, emit)?;
            }
        }
    }
    Ok(())
}
