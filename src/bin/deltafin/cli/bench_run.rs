//! `deltafin bench ...`: each subcommand's flags turned into its bench's options, and the run
//! (the flags themselves are `bench_args`).

use deltafin::mxfp4::Kernel;

use super::bench_args::BenchKind;

fn parse_kernel(s: &str) -> anyhow::Result<Kernel> {
    Kernel::ALL
        .into_iter()
        .find(|k| k.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = Kernel::ALL.iter().map(|k| k.name()).collect();
            anyhow::anyhow!("unknown kernel `{s}` ({})", names.join(", "))
        })
}

/// Runs one benchmark, printing its JSON lines on stdout.
pub fn run(kind: BenchKind) -> anyhow::Result<()> {
    match kind {
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
            let mut load = deltafin::runtime::load::LoadOptions {
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
        BenchKind::Forward {
            model_root,
            prompt_len,
            decode,
            runs,
            device,
            floor,
            speculate,
            spec_mode,
            spec_depth,
            text,
            chat_prompts,
            drafter,
            stream_spine,
            cold_spine,
            oracle_drafts,
            ram_gb,
        } => {
            use deltafin::runtime::family::DenseWeights;
            let family = deltafin::models::family(&model_root)?;
            if floor && family.dense_weights() == DenseWeights::Mapped {
                // Mapped dense weights (no spine store): their own floor measurement.
                return crate::bench::decode::decode_floor(
                    &model_root,
                    ram_gb.map(|g| (g * (1u64 << 30) as f64) as u64),
                    prompt_len,
                    decode,
                    runs,
                    |line| println!("{line}"),
                )
                .map_err(Into::into);
            }
            let device = deltafin::compute::device::select(device)?;
            println!("device={}", deltafin::compute::device::describe(&device));
            let load = deltafin::runtime::load::LoadOptions {
                resident_cap: stream_spine.then_some(0),
                // `--floor --cold-spine`: experts cold too (no RAM tier to hit).
                expert_ram: (floor && cold_spine).then_some(0),
                // Cold: as on a machine whose page cache cannot hold the streamed layers.
                direct_spine: cold_spine.then_some(true),
                ..Default::default()
            };
            let mut model = family.open(&model_root, &device, &load, &mut |p| eprintln!("{p}"))?;
            let emit = |l: serde_json::Value| println!("{l}");
            if speculate {
                let len = prompt_len.max(2);
                let prompts = match &text {
                    Some(t) if chat_prompts => {
                        chat_text_prompts(family, &model_root, model.as_ref(), t)?
                    }
                    Some(t) => text_prompts(family, &model_root, t, len)?,
                    None => {
                        crate::bench::speculate::synthetic_prompts(model.vocab_size() as u32, len)
                    }
                };
                let o = crate::bench::speculate::SpecBenchOptions {
                    decode: decode.max(2),
                    runs,
                    spec: deltafin::runtime::generate::Speculation {
                        mode: spec_mode,
                        depth: spec_depth.clamp(1, deltafin::runtime::generate::spec::MAX_DEPTH),
                    },
                    prompts,
                    cold: cold_spine,
                    oracle: oracle_drafts,
                    head: match &drafter {
                        Some(d) => Some(deltafin::drafters::DraftHead::open(d)?),
                        None => None,
                    },
                };
                return crate::bench::speculate::spec_bench(model.as_mut(), &model_root, &o, emit)
                    .map_err(Into::into);
            }
            if floor {
                let o = crate::bench::floor::FloorOptions {
                    prompt_len,
                    decode,
                    runs,
                    cold: cold_spine,
                };
                return crate::bench::floor::floor_bench(
                    model.as_mut(),
                    family,
                    &model_root,
                    &o,
                    emit,
                )
                .map_err(Into::into);
            }
            let opts = deltafin::measure::forward::ForwardBenchOptions {
                prompt_len: prompt_len.max(1),
                decode,
                runs,
            };
            crate::bench::forward_bench(model.as_ref(), &opts, emit)?;
        }
        BenchKind::Dense {
            gb,
            runs,
            threads,
            rows,
            kernel,
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
                kernels: kernel.iter().map(|k| k.dense()).collect(),
            };
            crate::bench::dense::dense_bench(&opts, |line| println!("{line}"))?;
        }
        BenchKind::Mxfp4 {
            experts,
            runs,
            kernel,
            threads,
            shape,
            rows,
        } => {
            let threads: Vec<usize> = threads.into_iter().filter(|&t| t > 0).collect();
            if threads.is_empty() {
                anyhow::bail!("--threads needs at least one positive count");
            }
            let mut opts = crate::bench::Mxfp4BenchOptions {
                experts,
                runs: runs.max(1),
                threads,
                shape,
                rows: if rows.is_empty() { vec![1] } else { rows },
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
    family: &dyn deltafin::runtime::family::ModelFamily,
    root: &std::path::Path,
    text: &std::path::Path,
    len: usize,
) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
    let tok = family.tokenizer(root)?;
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

/// Ten sentences of `text` spread over it (20 to 300 characters), each a user message in the
/// model's chat format: held-out chat prompts.
fn chat_text_prompts(
    family: &dyn deltafin::runtime::family::ModelFamily,
    root: &std::path::Path,
    model: &dyn deltafin::Model,
    text: &std::path::Path,
) -> anyhow::Result<Vec<(String, Vec<u32>)>> {
    use deltafin::chat::{encode_marked, ChatOptions, Message};
    let tok = family.tokenizer(root)?;
    let s = std::fs::read_to_string(text)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", text.display()))?;
    let sentences: Vec<&str> = s
        .split(['.', '?', '!'])
        .map(str::trim)
        .filter(|x| x.len() > 20 && x.len() < 300)
        .collect();
    anyhow::ensure!(
        sentences.len() >= 10,
        "{} holds fewer than 10 sentences",
        text.display()
    );
    let n = sentences.len();
    (0..10)
        .map(|i| {
            let msg = [Message::new("user", sentences[n * i / 10])];
            let (segs, marks) = model.chat_format().render(&msg, &ChatOptions::default())?;
            Ok((format!("chat_{i}"), encode_marked(&tok, &segs, &marks).0))
        })
        .collect()
}
