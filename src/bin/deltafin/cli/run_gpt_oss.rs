//! `deltafin run` on a gpt-oss checkpoint: greedy generation under the memory plan from token
//! ids, raw text, or (`--chat`) one user turn in harmony's format whose reply is split into
//! reasoning (analysis channel) and content (final channel) on token ids; the same JSON report
//! (`generated_ids`, `prefill`, `memory`) as K3's run, plus `text`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;

use deltafin::chat::harmony::{render, Channel, HarmonyOptions, HarmonySplitter, Reasoning};
use deltafin::chat::Message;
use deltafin::generate::argmax;
use deltafin::models::gpt_oss::tokenizer::GptOssTokenizer;
use deltafin::models::gpt_oss::{GptOssModel, GptOssOptions};

use super::run::RunArgs;

/// Runs `deltafin run` on the gpt-oss checkpoint in `root`.
pub fn run(a: &RunArgs, root: &Path) -> anyhow::Result<()> {
    // Text prompts need the checkpoint's tokenizer.json; --chat renders harmony.
    let tok = match &a.prompt {
        Some(_) => Some(GptOssTokenizer::from_dir(root)?),
        None => None,
    };
    let prompt_ids = match (&a.prompt, &tok) {
        (Some(p), Some(t)) if a.chat => {
            let opts = HarmonyOptions {
                date: today(),
                reasoning: match a.effort.as_deref() {
                    Some("low") => Reasoning::Low,
                    Some("high") | Some("max") => Reasoning::High,
                    None | Some("medium") => Reasoning::Medium,
                    Some(other) => bail!("--effort {other}: gpt-oss takes low, medium or high"),
                },
                ..Default::default()
            };
            t.encode_segments(&render(&[Message::new("user", p)], &opts)?)?
        }
        (Some(p), Some(t)) => t.encode(p)?,
        _ => a.prompt_ids.clone(),
    };
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
    let mut eos = model.config().eos_ids()?;
    if let Some(t) = &tok {
        let h = t.harmony_ids();
        eos.extend([h.ret, h.call]);
    }
    let max_new = a.max_new.unwrap_or(if a.chat { 8192 } else { 64 });
    // Ctrl-C stops between tokens (a prefill runs to its end: a second Ctrl-C exits at once).
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let mut state = model.new_state();
    let t0 = Instant::now();
    let read0 = model.experts().stats().unwrap_or_default().bytes_read();
    let mut logits = model.forward(&prompt_ids, &mut state)?;
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
        if out.len() == max_new || cancel.load(Ordering::SeqCst) {
            break;
        }
        logits = model.forward(&[next], &mut state)?;
    }
    let decode_ms = t1.elapsed().as_secs_f64() * 1e3;
    let (_, peak) = deltafin::memory::rss();
    let text = tok.as_ref().map(|t| split_reply(t, &out, a.chat));
    if a.json {
        let v = serde_json::json!({
            "model_type": "gpt_oss",
            "prompt_ids": prompt_ids,
            "text": text,
            "generated_ids": out,
            "prefill": {"tokens": prompt_ids.len(), "ms": prefill_ms,
                "passes": prompt_ids.len().div_ceil(model.plan().map_or(1, |p| p.prefill_pass.max(1))),
                "bytes_read": prefill_read},
            "decode_ms_per_token": decode_ms / out.len().max(1) as f64,
            "memory": {"peak_rss_bytes": peak, "plan": model.plan()},
        });
        println!("{v}");
    } else {
        match &text {
            Some(t) => {
                if let Some(r) = t.get("reasoning").and_then(|r| r.as_str()) {
                    eprintln!("[reasoning] {r}");
                }
                println!("{}", t["content"].as_str().unwrap_or_default());
            }
            None => println!("{out:?}"),
        }
        eprintln!(
            "prefill {} tokens in {:.1} s, {} tokens at {:.0} ms/token, peak RSS {:.2} GB",
            prompt_ids.len(),
            prefill_ms / 1e3,
            out.len(),
            decode_ms / out.len().max(1) as f64,
            peak as f64 / 1e9
        );
    }
    Ok(())
}

/// The reply as text: with `chat`, `{"reasoning", "content"}` split on harmony's channels; else
/// `{"content"}`.
fn split_reply(t: &GptOssTokenizer, ids: &[u32], chat: bool) -> serde_json::Value {
    if !chat {
        return serde_json::json!({ "content": t.decode(ids) });
    }
    let mut s = HarmonySplitter::new(t.harmony_ids(), t.decoder());
    let (mut reasoning, mut content) = (Vec::new(), Vec::new());
    for &id in ids {
        match s.push(id) {
            Some(Channel::Analysis) => reasoning.push(id),
            Some(Channel::Final) => content.push(id),
            _ => {}
        }
    }
    serde_json::json!({"reasoning": t.decode(&reasoning), "content": t.decode(&content)})
}

/// Today's date (UTC) as YYYY-MM-DD, for harmony's system block.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    deltafin::chat::harmony::civil_date(secs)
}
