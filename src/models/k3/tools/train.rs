//! `deltafin-k3 train`: trains a K3-architecture model on text files and exports it in K3's
//! format; `compare-fp32`: the trained fp32 network against the exported checkpoint.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use deltafin::models::k3::train::{
    export::export, heldout_nll, run_config, train, Dims, TrainOptions,
};
use deltafin::tokenizer::Tokenizer;

/// Arguments of `deltafin-k3 train`.
#[derive(Debug, clap::Args)]
pub struct TrainArgs {
    /// Training text files (repeatable).
    #[arg(long = "text", required = true)]
    pub text: Vec<PathBuf>,
    /// Tokenizer directory (`deltafin-k3 train-tokenizer --out`).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Output model directory (K3 format).
    #[arg(long)]
    pub out: PathBuf,
    /// Checkpoint directory; a run there of the same dimensions and seed is resumed.
    #[arg(long, default_value = "target/k3-tiny-train")]
    pub work: PathBuf,
    /// Held-out text: its fp32 NLL is measured after training and kept in TRAINING.json.
    #[arg(long)]
    pub heldout: Option<PathBuf>,
    /// Optimiser steps.
    #[arg(long, default_value_t = 3000)]
    pub steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Share of paragraphs framed as chat turns.
    #[arg(long, default_value_t = 0.3)]
    pub chat_fraction: f64,
    /// Router-bias step per update (noaux_tc).
    #[arg(long, default_value_t = 1e-3)]
    pub bias_rate: f64,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Steps between checkpoints.
    #[arg(long, default_value_t = 100)]
    pub checkpoint_every: usize,
    /// Shards of the exported model.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Hidden size (K3-tiny's by default; smaller for quick trials).
    #[arg(long, default_value_t = Dims::TINY.hidden)]
    pub hidden: usize,
}

/// Runs `deltafin-k3 train`.
pub fn run(a: &TrainArgs) -> anyhow::Result<()> {
    let dims = Dims {
        hidden: a.hidden,
        ..Dims::TINY
    };
    let o = TrainOptions {
        texts: a.text.clone(),
        tokenizer: a.tokenizer.clone(),
        work: a.work.clone(),
        dims,
        steps: a.steps,
        batch: a.batch,
        seq: a.seq,
        lr: a.lr,
        warmup: a.warmup,
        chat_fraction: a.chat_fraction,
        bias_rate: a.bias_rate,
        seed: a.seed,
        checkpoint_every: a.checkpoint_every,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    // A second Ctrl-C while the checkpoint is written is ignored: the write is atomic anyway.
    let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
    let (net, report) = train(&o, &cancel)?;
    if report.interrupted {
        eprintln!(
            "stopped at step {} (checkpoint in {}); run the same command to resume",
            report.steps,
            a.work.display()
        );
        return Ok(());
    }
    let tok = Tokenizer::from_dir(&a.tokenizer)?;
    let (json, _) = run_config(&o, &tok)?;
    let nll = match &a.heldout {
        Some(p) => {
            let text = std::fs::read_to_string(p)?;
            let ids = tok.encode_ordinary(&text);
            let t0 = std::time::Instant::now();
            let nll = heldout_nll(&net, &ids, a.seq)?;
            eprintln!(
                "held-out fp32 NLL {nll:.4} nats/token over {} tokens ({:.0} s)",
                ids.len(),
                t0.elapsed().as_secs_f64()
            );
            Some(nll)
        }
        None => None,
    };
    export(&net, &json, &a.tokenizer, &a.out, a.shards)?;
    let record = serde_json::json!({
        "options": o, "report": report, "heldout": a.heldout, "heldout_nll_fp32": nll,
        "eval_window": a.seq,
    });
    deltafin::fsio::atomic::write_atomic(
        &a.out.join("TRAINING.json"),
        serde_json::to_string_pretty(&record)?.as_bytes(),
    )?;
    eprintln!(
        "trained {} steps ({} tokens, {:.0} s, final loss {:.3}); wrote {}",
        report.steps,
        report.tokens,
        report.seconds,
        report.final_loss,
        a.out.display()
    );
    Ok(())
}

/// Arguments of `deltafin-k3 compare-fp32`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The exported model directory (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// The training run's directory (`train --work`), holding `weights.safetensors`.
    #[arg(long)]
    pub work: PathBuf,
    /// Text scored by both.
    #[arg(long)]
    pub text: PathBuf,
    /// Window length: each window is scored from an empty context.
    #[arg(long, default_value_t = 128)]
    pub window: usize,
    /// Score at most this many tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// The checkpoint's spine format: bf16, int8 or auto.
    #[arg(long, default_value = "bf16")]
    pub spine: String,
}

/// Runs `deltafin-k3 compare-fp32`, printing one JSON object.
pub fn compare_fp32(a: &CompareArgs) -> anyhow::Result<()> {
    use deltafin::spine::source::SpineChoice;
    let root = match &a.model_root {
        Some(r) => r.clone(),
        None => deltafin::assets::k3_tiny()?,
    };
    let spine = match a.spine.as_str() {
        "auto" => SpineChoice::Auto,
        "int8" => SpineChoice::Int8,
        "bf16" => SpineChoice::Bf16,
        other => anyhow::bail!("--spine {other}: use auto, int8 or bf16"),
    };
    let cfg = deltafin::models::k3::config::K3Config::from_file(&root.join("config.json"))?;
    let net = deltafin::models::k3::train::Net::from_checkpoint(
        &cfg,
        &a.work.join("weights.safetensors"),
    )?;
    let opts = deltafin::EngineOptions {
        load: deltafin::runtime::load::LoadOptions {
            spine,
            ..Default::default()
        },
        ..Default::default()
    };
    let engine = deltafin::Engine::open_with(&root, &opts, |p| eprintln!("{p}"))?;
    let tok = deltafin::tokenizer::Tokenizer::from_dir(&root)?;
    let text = std::fs::read_to_string(&a.text)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", a.text.display()))?;
    let ids = tok.encode_ordinary(&text);
    let model = engine.into_model();
    let r = deltafin::eval::compare(&net, &model, &ids, a.window, a.max_tokens)?;
    let out = serde_json::json!({"a": "fp32", "b": a.spine, "report": r});
    println!("{out}");
    Ok(())
}
