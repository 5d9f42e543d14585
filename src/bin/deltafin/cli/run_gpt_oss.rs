//! `deltafin run` on a gpt-oss checkpoint: greedy generation from token ids under the memory
//! plan, with the same JSON report (`generated_ids`, `prefill`, `memory`) as K3's run. gpt-oss's
//! tokenizer and harmony chat format are not wired to the front ends yet: `--prompt` is refused
//! with that said.

use std::path::Path;
use std::time::Instant;

use anyhow::bail;

use deltafin::generate::argmax;
use deltafin::models::gpt_oss::{GptOssModel, GptOssOptions};

use super::run::RunArgs;

/// Runs `deltafin run` on the gpt-oss checkpoint in `root`.
pub fn run(a: &RunArgs, root: &Path) -> anyhow::Result<()> {
    if a.prompt.is_some() || a.chat {
        bail!(
            "{}: gpt-oss runs from --prompt-ids for now (its tokenizer and harmony chat format are not wired to the front ends yet)",
            root.display()
        );
    }
    let gb = |g: f64| (g * 1e9) as u64;
    let mut o = GptOssOptions {
        memory_limit: a.store.memory_gb.map(gb),
        expert_ram: a.store.ram_gb.map(gb),
        context: a.store.context,
        ..Default::default()
    };
    o.store.readers = a.store.readers;
    o.store.prefetch_previous = !a.store.no_prefetch;
    let quiet = a.json;
    let model = GptOssModel::open_planned(root, &o, |p| {
        if !quiet {
            eprintln!("{p}");
        }
    })?;
    let eos = model.config().eos_ids()?;
    let max_new = a.max_new.unwrap_or(64);
    let mut state = model.new_state();
    let t0 = Instant::now();
    let read0 = model.experts().stats().unwrap_or_default().bytes_read();
    let mut logits = model.forward(&a.prompt_ids, &mut state)?;
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
    let prefill_read = model.experts().stats().unwrap_or_default().bytes_read() - read0;
    let t1 = Instant::now();
    let mut out = Vec::new();
    while out.len() < max_new {
        let next = argmax(&logits);
        out.push(next);
        if !a.ignore_eos && eos.contains(&next) {
            break;
        }
        if out.len() == max_new {
            break;
        }
        logits = model.forward(&[next], &mut state)?;
    }
    let decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (_, peak) = deltafin::memory::rss();
    if a.json {
        let v = serde_json::json!({
            "model_type": "gpt_oss",
            "prompt_ids": a.prompt_ids,
            "generated_ids": out,
            "prefill": {"tokens": a.prompt_ids.len(), "ms": prefill_ms,
                "passes": a.prompt_ids.len().div_ceil(model.plan().map_or(1, |p| p.prefill_pass.max(1))),
                "bytes_read": prefill_read},
            "decode_ms_per_token": decode_ms / out.len().max(1) as f64,
            "memory": {"peak_rss_bytes": peak, "plan": model.plan()},
        });
        println!("{v}");
    } else {
        println!("{out:?}");
        eprintln!(
            "prefill {} tokens in {:.1} s, {} tokens at {:.0} ms/token, peak RSS {:.2} GB",
            a.prompt_ids.len(),
            prefill_ms / 1e3,
            out.len(),
            decode_ms / out.len().max(1) as f64,
            peak as f64 / 1e9
        );
    }
    Ok(())
}
