//! Interactive multi-turn chat with K3.
//!
//! `cargo run --release --example chat [MODEL_ROOT] [--no-thinking] [--show-reasoning]`
//! uses the model in MODEL_ROOT (or `DELTAFIN_MODEL_ROOT`). When no K3 is installed there, it
//! writes the built-in K3-nano fixture (random weights, K3's exact format) to a cache directory
//! and chats with that, so the example runs on a fresh machine without network.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deltafin::chat::{ChatOptions, Delta, Effort, Message};
use deltafin::{Engine, EngineOptions, GenerateOptions};

fn model_root(arg: Option<String>) -> anyhow::Result<PathBuf> {
    if let Some(p) = arg.or_else(|| std::env::var("DELTAFIN_MODEL_ROOT").ok()) {
        let p = PathBuf::from(p);
        if p.join("config.json").is_file() {
            return Ok(p);
        }
        eprintln!("no model at {} (config.json missing)", p.display());
    }
    let dir = std::env::temp_dir().join("deltafin-k3-nano");
    eprintln!(
        "No K3 install found: using K3-nano, a tiny random-weight model of K3's exact shape and \
         format, at {}.\nIts replies are noise. To chat with K3, install it (`deltafin setup`) \
         and pass its model root: cargo run --release --example chat -- /path/to/k3",
        dir.display()
    );
    if !dir.join("config.json").is_file() {
        deltafin::checkpoint::fixture::write_nano(&dir, &Default::default())?;
    }
    Ok(dir)
}

fn main() -> anyhow::Result<()> {
    deltafin::init_threads();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let thinking = !args.iter().any(|a| a == "--no-thinking");
    let show_reasoning = args.iter().any(|a| a == "--show-reasoning");
    let root = model_root(args.iter().find(|a| !a.starts_with("--")).cloned())?;
    // Metal when built with `--features metal` on a Mac, else the CPU; under the memory plan
    // (printed first): what is pinned, the RAM tier, the context limit.
    let engine = Engine::open_with(&root, &EngineOptions::default(), |p| eprintln!("{p}"))?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        ctrlc::set_handler(move || c.store(true, Ordering::SeqCst))?;
    }
    let chat = ChatOptions {
        thinking,
        effort: if thinking {
            Some(Effort::resolve(None)?)
        } else {
            None
        },
        tools: None,
    };
    let max_new: usize = std::env::var("DELTAFIN_MAX_NEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let gen_opts = GenerateOptions {
        max_new,
        stop_ids: vec![engine.eos()],
    };
    let dim = std::io::stderr().is_terminal();
    // One session for the whole chat: each turn feeds only what is new.
    let mut session = engine.session(chat);
    let stdin = std::io::stdin();
    eprint!("> ");
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        cancel.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout();
        let turn = session.chat_turn(
            &[Message::new("user", line.trim())],
            &gen_opts,
            &cancel,
            &mut |l: &[f32]| deltafin::generate::argmax(l),
            |d| match d {
                Delta::Reasoning(t) if dim => eprint!("\x1b[2m{t}\x1b[0m"),
                Delta::Reasoning(t) if show_reasoning => eprint!("{t}"),
                Delta::Reasoning(_) => {}
                Delta::Content(t) => {
                    let _ = write!(out, "{t}");
                    let _ = out.flush();
                }
            },
        )?;
        println!();
        let g = &turn.generation;
        let steps = g.generated_ids.len().saturating_sub(1).max(1);
        eprintln!(
            "[{} tokens, {:?}; prefill {:.0} ms for {} new tokens ({} in the session), decode {:.2} ms/token]",
            g.generated_ids.len(),
            g.stop,
            g.prefill_ms,
            g.prompt_ids.len(),
            session.tokens().len(),
            g.decode_ms / steps as f64
        );
        eprint!("> ");
    }
    Ok(())
}
