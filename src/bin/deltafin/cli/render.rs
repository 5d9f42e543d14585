//! `deltafin render`: the prompt ids `serve` would feed for chat request bodies, one JSON line
//! in and one out, rendered by the server's own code (`server::prompt`) with the model's chat
//! format and tokenizer; nothing else of the model is loaded. A check can then compare our
//! prompts with another implementation's (scripts/harmony_check.py: openai-harmony).

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

/// Arguments of `render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Model directory (config.json and the tokenizer files; default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Chat request bodies, one JSON object per line (`-`: standard input).
    #[arg(long, default_value = "-")]
    pub requests: String,
    /// The date harmony's system block names (default: today, as `serve` does).
    #[arg(long)]
    pub date: Option<String>,
}

/// Writes `{"ids": [...], "text": "..."}` per request line, or `{"error": "..."}` for a
/// request `serve` would refuse with 400.
pub fn run(a: &RenderArgs) -> anyhow::Result<()> {
    let root = a
        .model_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(deltafin::assets::K3_TINY_DIR));
    let family = deltafin::models::family(&root)?;
    let format = family.chat_format();
    let tok = family
        .tokenizer(&root)
        .with_context(|| format!("loading the tokenizer of {}", root.display()))?;
    let input: Box<dyn BufRead> = match a.requests.as_str() {
        "-" => Box::new(std::io::stdin().lock()),
        p => Box::new(std::io::BufReader::new(
            std::fs::File::open(p).with_context(|| format!("opening {p}"))?,
        )),
    };
    let date = Some(a.date.clone().unwrap_or_else(super::reply::today));
    let effort = std::env::var("K3_REASONING_EFFORT").ok();
    let mut out = std::io::stdout().lock();
    for (n, line) in input.lines().enumerate() {
        let line = line.with_context(|| format!("reading request line {}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let v = match deltafin::server::prompt::render_chat(
            line.as_bytes(),
            format,
            &tok,
            effort.as_deref(),
            date.clone(),
        ) {
            Ok((ids, _)) => serde_json::json!({"ids": ids, "text": tok.decode(&ids)}),
            Err(e) => serde_json::json!({"error": e.message}),
        };
        writeln!(out, "{v}")?;
    }
    Ok(())
}
