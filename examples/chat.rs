//! Interactive chat. Uses the K3 model root in `DELTAFIN_MODEL_ROOT` (or the first argument);
//! when none is installed it writes and uses the built-in K3-nano model.
//!
//! Until the tokenizer lands (issue 6) text is encoded one byte per token (K3's BPE ranks start
//! with the 256 single bytes) and decoded through `tiktoken.model`.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use base64::Engine;
use deltafin::{GenerateOptions, Generator, K3Model};

fn model_root() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("DELTAFIN_MODEL_ROOT").ok())
    {
        return Ok(PathBuf::from(p));
    }
    let dir = std::env::temp_dir().join("deltafin-k3-nano");
    if !dir.join("config.json").is_file() {
        eprintln!(
            "no K3 installed: writing the built-in K3-nano model to {}",
            dir.display()
        );
        deltafin::checkpoint::fixture::write_nano(&dir, &Default::default())?;
    }
    Ok(dir)
}

fn load_ranks(root: &std::path::Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let path = root.join("tiktoken.model");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut ranks = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let tok = line.split_whitespace().next().unwrap_or("");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(tok)
            .with_context(|| format!("{} line {}: bad base64", path.display(), n + 1))?;
        ranks.push(bytes);
    }
    Ok(ranks)
}

fn main() -> anyhow::Result<()> {
    deltafin::init_threads();
    let root = model_root()?;
    let model = K3Model::from_dir(&root, &candle::Device::Cpu)?;
    let ranks = load_ranks(&root)?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let c = cancel.clone();
        ctrlc::set_handler(move || c.store(true, Ordering::SeqCst))?;
    }
    let opts = GenerateOptions {
        max_new: 48,
        stop_ids: vec![model.config().eos_token_id],
    };
    let stdin = std::io::stdin();
    eprint!("> ");
    std::io::stderr().flush()?;
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            eprint!("> ");
            continue;
        }
        cancel.store(false, Ordering::SeqCst);
        let ids: Vec<u32> = line.bytes().map(u32::from).collect();
        let mut state = model.new_state();
        let mut out = std::io::stdout();
        let gen = Generator::new(&model).generate(&mut state, &ids, &opts, &cancel, |id| {
            let bytes = ranks
                .get(id as usize)
                .cloned()
                .unwrap_or_else(|| format!("<{id}>").into_bytes());
            let _ = out.write_all(&bytes);
            let _ = out.flush();
        })?;
        println!();
        let steps = gen.generated_ids.len().saturating_sub(1).max(1);
        eprintln!(
            "[{} tokens, {:?}; prefill {:.1} ms, decode {:.2} ms/token]",
            gen.generated_ids.len(),
            gen.stop,
            gen.prefill_ms,
            gen.decode_ms / steps as f64
        );
        eprint!("> ");
    }
    Ok(())
}
