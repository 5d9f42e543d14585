//! Interactive multi-turn chat with K3, or any model the runtime runs (gpt-oss: harmony).
//!
//! `cargo run --release --example chat [MODEL_ROOT] [--no-thinking] [--show-reasoning]
//! [--temperature 0.8] [--greedy] [--seed N] [--speculate auto|ngram|off] [--spec-depth 8] [--drafter DIR|none]`
//! uses the model in MODEL_ROOT (or `DELTAFIN_MODEL_ROOT`). Without one it chats with the
//! built-in K3-tiny (`assets/k3-tiny`, a small trained model in K3's exact format), so the example
//! answers in English on a fresh machine without network. `/save NAME` writes the session
//! (state, tokens, history) to `DELTAFIN_SESSIONS` (default `~/.local/share/deltafin/sessions`)
//! and `/load NAME` resumes it, also after a restart.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deltafin::chat::{ChatOptions, Delta, Message};
use deltafin::engine::prompt_cache::PromptCacheOptions;
use deltafin::progress::{PrefillProgress, ProgressMode};
use deltafin::runtime::load::CacheRam;
use deltafin::{Engine, EngineOptions, GenerateOptions, Session};

fn model_root(arg: Option<String>) -> anyhow::Result<PathBuf> {
    if let Some(p) = arg.or_else(|| std::env::var("DELTAFIN_MODEL_ROOT").ok()) {
        let p = PathBuf::from(p);
        if p.join("config.json").is_file() {
            return Ok(p);
        }
        eprintln!("no model at {} (config.json missing)", p.display());
    }
    let dir = deltafin::assets::k3_tiny()?;
    eprintln!(
        "No K3 given: chatting with the built-in K3-tiny (K3's architecture, 6 layers, trained on \
         Austen, Shakespeare and the Bible) at {}. For K3: chat -- /path/to/k3",
        dir.display()
    );
    Ok(dir)
}

fn main() -> anyhow::Result<()> {
    deltafin::init(std::env::var_os("RAYON_NUM_THREADS").is_some());
    let (mut thinking, mut show_reasoning, mut root_arg) = (true, false, None);
    // Sampling by default: greedy decoding of a small model loops (K3-tiny, thinking on:
    // 16 of 20 replies ran to the limit greedily, none at 0.8; see README).
    let (mut temperature, mut seed) = (0.8f64, 0u64);
    // Speculative decoding (auto by default): the replies are the same either way.
    let mut speculation = deltafin::runtime::generate::Speculation::default();
    let mut drafter: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--no-thinking" => thinking = false,
            "--show-reasoning" => show_reasoning = true,
            "--greedy" => temperature = 0.0,
            "--drafter" => {
                drafter = Some(
                    args.next()
                        .ok_or_else(|| anyhow::anyhow!("--drafter needs a directory or none"))?,
                );
            }
            "--speculate" | "--spec-depth" => {
                let v = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))?;
                if a == "--speculate" {
                    speculation.mode = v.parse()?;
                } else {
                    speculation.depth = v
                        .parse::<usize>()
                        .ok()
                        .filter(|d| (1..=16).contains(d))
                        .ok_or_else(|| anyhow::anyhow!("--spec-depth {v}: use 1..=16"))?;
                }
            }
            "--temperature" | "--seed" => {
                let v = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))?;
                if a == "--seed" {
                    seed = v
                        .parse()
                        .map_err(|_| anyhow::anyhow!("--seed {v}: not a number"))?;
                } else {
                    temperature = v
                        .parse()
                        .map_err(|_| anyhow::anyhow!("--temperature {v}: not a number"))?;
                }
            }
            flag if flag.starts_with("--") => anyhow::bail!(
                "unknown flag {flag}: use [MODEL_ROOT] [--no-thinking] [--show-reasoning] \
                 [--temperature T] [--greedy] [--seed N] [--speculate auto|ngram|off] [--drafter DIR|none] \
                 [--spec-depth N]"
            ),
            _ => root_arg = Some(a),
        }
    }
    let root = model_root(root_arg)?;
    let mut sampler = deltafin::runtime::generate::sample::Sampler::new(temperature, 0.95, seed);
    // Metal when built with `--features metal` on a Mac, else the CPU; under the memory plan
    // (printed first): what is pinned, the RAM tier, the context limit.
    let mut opts = EngineOptions::default();
    opts.load.prompt_cache = CacheRam::Auto;
    let mut engine = Engine::open_with(&root, &opts, |p| eprintln!("{p}"))?;
    // Drafts from an EAGLE-3 head: `--drafter DIR`, else the model's own (K3-tiny ships one);
    // `--drafter none`: n-gram drafts. The replies are the same either way, only faster.
    let head = match drafter.as_deref() {
        Some("none") => None,
        Some(d) => Some(std::path::PathBuf::from(d)),
        None => deltafin::drafters::installed(&root),
    };
    if let Some(d) = head {
        engine.use_drafter(&d)?;
        eprintln!("drafter: the EAGLE-3 head in {}", d.display());
    }
    // The prompt cache (RAM, the plan's line): a conversation restarted with the same opening
    // resumes from its longest saved prefix.
    let ram_bytes = engine.model().plan().map_or(1 << 30, |p| p.prompt_cache);
    engine.enable_prompt_cache(PromptCacheOptions {
        ram_bytes,
        ..Default::default()
    })?;
    // A long prompt's prefill shows where it is (layer, pass, bytes read, ETA).
    engine
        .model_mut()
        .observe(Arc::new(PrefillProgress::new(ProgressMode::Terminal)));
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        ctrlc::set_handler(move || c.store(true, Ordering::SeqCst))?;
    }
    let chat = ChatOptions {
        thinking,
        effort: if thinking {
            Some(
                engine
                    .chat_format()
                    .effort(None, std::env::var("K3_REASONING_EFFORT").ok().as_deref())?,
            )
        } else {
            None
        },
        // Formats that render today's date (gpt-oss's harmony) get the system clock's.
        date: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| deltafin::chat::harmony::civil_date(d.as_secs())),
        ..Default::default()
    };
    let max_new: usize = std::env::var("DELTAFIN_MAX_NEW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let gen_opts = GenerateOptions {
        max_new,
        stop_ids: engine.stop_ids(),
        speculation,
    };
    let dim = std::io::stderr().is_terminal();
    // One session for the whole chat: each turn feeds only what is new.
    let mut session = engine.session(chat.clone());
    let sessions = sessions_dir();
    let stdin = std::io::stdin();
    eprint!("> ");
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        if let Some(cmd) = line.trim().strip_prefix('/') {
            // /save NAME and /load NAME: the whole session (state, tokens, history) on disk.
            match session_command(cmd, &sessions) {
                Ok((true, path)) => match session.save(&path) {
                    Ok(b) => eprintln!("saved {} ({:.1} MB)", path.display(), b as f64 / 1e6),
                    Err(e) => eprintln!("not saved: {e}"),
                },
                Ok((false, path)) => match Session::load(&engine, chat.clone(), &path) {
                    Ok(s) => {
                        eprintln!(
                            "loaded {} ({} tokens, {} messages)",
                            path.display(),
                            s.tokens().len(),
                            s.history().len()
                        );
                        session = s;
                    }
                    Err(e) => eprintln!("not loaded: {e}"),
                },
                Err(e) => eprintln!("{e}"),
            }
            eprint!("> ");
            continue;
        }
        cancel.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout();
        let turn = session.chat_turn(
            &[Message::new("user", line.trim())],
            &gen_opts,
            &cancel,
            &mut |l: &[f32]| sampler.choose(l),
            |d| match d {
                Delta::Reasoning(t) if dim => eprint!("\x1b[2m{t}\x1b[0m"),
                Delta::Reasoning(t) if show_reasoning => eprint!("{t}"),
                Delta::Reasoning(_) => {}
                Delta::Content(t) => {
                    let _ = write!(out, "{t}");
                    let _ = out.flush();
                }
                Delta::ToolCall(c) => {
                    let _ = write!(out, "\n[tool call] {}({})", c.name, c.arguments);
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

/// Where `/save` and `/load` keep sessions: `DELTAFIN_SESSIONS`, else
/// `~/.local/share/deltafin/sessions`.
fn sessions_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("DELTAFIN_SESSIONS") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".local/share/deltafin/sessions")
}

/// Parses `save NAME` (true) or `load NAME` (false) into the session file's path.
fn session_command(cmd: &str, dir: &Path) -> anyhow::Result<(bool, PathBuf)> {
    let (verb, name) = cmd.split_once(' ').unwrap_or((cmd, ""));
    let name = name.trim();
    let save = match verb {
        "save" => true,
        "load" => false,
        _ => anyhow::bail!("commands: /save NAME, /load NAME"),
    };
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        anyhow::bail!("a session name is letters, digits, '-' and '_' (e.g. /{verb} my-chat)");
    }
    std::fs::create_dir_all(dir)?;
    Ok((save, dir.join(format!("{name}.dfsession"))))
}
