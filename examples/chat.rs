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

use deltafin::chat::{encode_segments, render, ChatOptions, ChatSplitter, Delta, Effort, Message};
use deltafin::tokenizer::{StreamDecoder, Tokenizer};
use deltafin::{GenerateOptions, Generator, K3Model};

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
    // Metal when built with `--features metal` on a Mac, else the CPU.
    let device = deltafin::gpu::select(deltafin::gpu::DeviceChoice::Auto)?;
    // Under the memory plan (printed first): what is pinned, the RAM tier, the context limit.
    let model = K3Model::open_with(&root, &device, &Default::default(), |p| eprintln!("{p}"))?;
    let tok = Tokenizer::from_dir(&root)?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        ctrlc::set_handler(move || c.store(true, Ordering::SeqCst))?;
    }
    let opts = ChatOptions {
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
        stop_ids: vec![model.config().eos_token_id],
    };
    let dim = std::io::stderr().is_terminal();
    let mut history: Vec<Message> = Vec::new();
    let stdin = std::io::stdin();
    eprint!("> ");
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        cancel.store(false, Ordering::SeqCst);
        history.push(Message::new("user", line.trim()));
        let ids = encode_segments(&tok, &render(&history, &opts)?);
        let mut state = model.new_state();
        let mut dec = StreamDecoder::new();
        let mut split = ChatSplitter::new(thinking);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut out = std::io::stdout();
        let mut show = |d: Vec<Delta>, reasoning: &mut String, content: &mut String| {
            for x in d {
                match x {
                    Delta::Reasoning(t) => {
                        if show_reasoning || dim {
                            if dim {
                                eprint!("\x1b[2m{t}\x1b[0m");
                            } else {
                                eprint!("{t}");
                            }
                        }
                        reasoning.push_str(&t);
                    }
                    Delta::Content(t) => {
                        let _ = write!(out, "{t}");
                        let _ = out.flush();
                        content.push_str(&t);
                    }
                }
            }
        };
        let gen = Generator::new(&model).generate(&mut state, &ids, &gen_opts, &cancel, |id| {
            show(
                split.push_id(&tok, &mut dec, id),
                &mut reasoning,
                &mut content,
            );
        })?;
        let mut rest = split.push(&dec.finish());
        rest.extend(split.finish());
        show(rest, &mut reasoning, &mut content);
        println!();
        let steps = gen.generated_ids.len().saturating_sub(1).max(1);
        eprintln!(
            "[{} tokens, {:?}; prefill {:.0} ms for {} tokens, decode {:.2} ms/token]",
            gen.generated_ids.len(),
            gen.stop,
            gen.prefill_ms,
            ids.len(),
            gen.decode_ms / steps as f64
        );
        let mut reply = Message::new("assistant", &content);
        reply.reasoning_content = Some(reasoning);
        history.push(reply);
        eprint!("> ");
    }
    Ok(())
}
