//! `deltafin run` on a model other than K3 (gpt-oss), through the engine and a session like
//! every front end: greedy generation under the memory plan from token ids, raw text, or
//! (`--chat`) one user turn in the model's chat format whose reply is split into reasoning and
//! content on token ids; the same JSON report (`generated_ids`, `prefill`, `memory`) as K3's
//! run, plus `text`. A prefill shows its progress; Ctrl-C stops between tokens.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deltafin::chat::{encode_marked, ChatOptions, Message};
use deltafin::generate::{argmax, GenerateOptions};
use deltafin::progress::{PrefillProgress, ProgressMode};

use super::run::RunArgs;

/// Runs `deltafin run` on the checkpoint in `root` (any family but K3's own run path).
pub fn run(a: &RunArgs, root: &Path) -> anyhow::Result<()> {
    let mut engine = super::store::load_engine(root, &a.store, 0)?;
    if !a.json {
        engine
            .model_mut()
            .observe(Arc::new(PrefillProgress::new(ProgressMode::Terminal)));
    }
    let chat = ChatOptions {
        effort: Some(engine.chat_format().effort(
            a.effort.as_deref(),
            std::env::var("K3_REASONING_EFFORT").ok().as_deref(),
        )?),
        date: Some(today()),
        ..Default::default()
    };
    let tok = engine.tokenizer();
    let prompt_ids = match &a.prompt {
        Some(p) if a.chat => {
            let (segs, marks) = engine
                .chat_format()
                .render(&[Message::new("user", p)], &chat)?;
            encode_marked(tok, &segs, &marks).0
        }
        Some(p) => tok.encode_ordinary(p),
        None => a.prompt_ids.clone(),
    };
    let opts = GenerateOptions {
        max_new: a.max_new.unwrap_or(if a.chat { 8192 } else { 64 }),
        stop_ids: if a.ignore_eos {
            Vec::new()
        } else {
            engine.stop_ids()
        },
        speculation: a.spec.speculation(),
    };
    // Ctrl-C stops between tokens (and a prefill between layers); a second one exits at once.
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let read0 = engine.model().bytes_read();
    let mut session = engine.session(chat.clone());
    let mut prefill_read = None;
    let g = session.generate(&prompt_ids, &opts, &cancel, &mut |l| argmax(l), |_| {
        prefill_read.get_or_insert_with(|| engine.model().bytes_read() - read0);
    })?;
    let (_, peak) = deltafin::memory::rss();
    let text = (a.prompt.is_some()).then(|| reply_text(&engine, &g.generated_ids, a.chat, &chat));
    let plan = engine.model().plan();
    if a.json {
        let v = serde_json::json!({
            "model_type": "gpt_oss",
            "prompt_ids": prompt_ids,
            "text": text,
            "generated_ids": g.generated_ids,
            "stop": g.stop,
            "prefill": {"tokens": prompt_ids.len(), "ms": g.prefill_ms,
                "passes": prompt_ids.len().div_ceil(engine.model().pass_len().max(1)),
                "bytes_read": prefill_read},
            "decode_ms_per_token": g.decode_ms / g.generated_ids.len().saturating_sub(1).max(1) as f64,
            "spec": g.spec,
            "memory": {"peak_rss_bytes": peak, "plan": plan},
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
            None => println!("{:?}", g.generated_ids),
        }
        eprintln!(
            "prefill {} tokens in {:.1} s, {} tokens at {:.0} ms/token ({:?}), peak RSS {:.2} GB",
            prompt_ids.len(),
            g.prefill_ms / 1e3,
            g.generated_ids.len(),
            g.decode_ms / g.generated_ids.len().saturating_sub(1).max(1) as f64,
            g.stop,
            peak as f64 / 1e9
        );
    }
    Ok(())
}

/// The reply as text: with `chat`, `{"reasoning", "content"}` split by the chat format's
/// splitter on token ids; else `{"content"}`.
fn reply_text(
    engine: &deltafin::Engine,
    ids: &[u32],
    chat: bool,
    opts: &ChatOptions,
) -> serde_json::Value {
    let tok = engine.tokenizer();
    if !chat {
        return serde_json::json!({ "content": tok.decode(ids) });
    }
    let Ok(mut split) = engine
        .chat_format()
        .splitter(engine.tokenizer_arc(), opts.thinking, false)
    else {
        return serde_json::json!({ "content": tok.decode(ids) });
    };
    let mut dec = deltafin::tokenizer::StreamDecoder::new();
    let (mut reasoning, mut content) = (String::new(), String::new());
    let mut take = |d: Vec<deltafin::chat::Delta>| {
        for x in d {
            match x {
                deltafin::chat::Delta::Reasoning(t) => reasoning.push_str(&t),
                deltafin::chat::Delta::Content(t) => content.push_str(&t),
                deltafin::chat::Delta::ToolCall(_) => {}
            }
        }
    };
    for &id in ids {
        take(split.push_id(tok, &mut dec, id));
    }
    take(split.finish(&mut dec));
    serde_json::json!({"reasoning": reasoning, "content": content})
}

/// Today's date (UTC) as YYYY-MM-DD, for chat formats that render one.
pub fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    deltafin::chat::harmony::civil_date(secs)
}
