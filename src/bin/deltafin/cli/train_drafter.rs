//! `deltafin train-drafter`: trains an EAGLE-3 head for the model in `--model-root` (any
//! family) on its own greedy continuations and hidden rows, and writes it in the published
//! layout (`drafters::eagle3::train`). Resumable from `--work`; Ctrl-C checkpoints and stops.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use deltafin::drafters::eagle3::train::{export, train_drafter, DrafterTrainOptions, WeightDtype};
use deltafin::{Engine, EngineOptions};

/// Arguments of `train-drafter`.
#[derive(Debug, Args)]
pub struct TrainDrafterArgs {
    /// The target model (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Text files the prompts are drawn from.
    #[arg(long = "text", required = true)]
    pub texts: Vec<PathBuf>,
    /// Where the head is written (config.json, model.safetensors).
    #[arg(long)]
    pub out: PathBuf,
    /// Checkpoints to resume from (default: OUT/../drafter-work).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Prompts whose continuations are trained on (a tenth is held out).
    #[arg(long, default_value_t = 400)]
    pub prompts: usize,
    /// Greedy tokens generated per prompt.
    #[arg(long, default_value_t = 96)]
    pub new_tokens: usize,
    /// Every n-th prompt is a user message in the model's chat format (0: none).
    #[arg(long, default_value_t = 3)]
    pub chat_every: usize,
    /// The three target layers tapped (0-based, rows after each; default: EAGLE-3's rule,
    /// layers 1, L/2 − 1 and L − 4, spread apart on a shallow model).
    #[arg(long, value_delimiter = ',')]
    pub layers: Option<Vec<usize>>,
    /// Draft steps unrolled in training.
    #[arg(long, default_value_t = 4)]
    pub draft_steps: usize,
    /// Draft vocabulary size (the target's most chosen ids; default: the whole vocabulary).
    #[arg(long)]
    pub draft_vocab: Option<usize>,
    /// The head's MLP width (default: 3 × the target's hidden size).
    #[arg(long)]
    pub intermediate: Option<usize>,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Optimiser steps.
    #[arg(long, default_value_t = 1500)]
    pub steps: usize,
    /// Samples per step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Warm-up steps of the learning rate.
    #[arg(long, default_value_t = 30)]
    pub warmup: usize,
    /// Seed of the prompts, the initialisation and the batches.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Store the weights as float32 (default bfloat16).
    #[arg(long)]
    pub f32: bool,
}

/// The default tapped layers of an `n`-layer target: EAGLE-3's `[1, n/2 − 1, n − 4]` when
/// those are three ascending layers, else three spread over the depth.
fn default_layers(n: usize) -> [usize; 3] {
    let rule = [1, (n / 2).saturating_sub(1), n.saturating_sub(4)];
    if rule[0] < rule[1] && rule[1] < rule[2] {
        rule
    } else {
        [1.min(n - 1), n / 2, n - 1]
    }
}

/// Runs `deltafin train-drafter`.
pub fn run(a: &TrainDrafterArgs) -> anyhow::Result<()> {
    let root = super::default_root(a.model_root.as_deref())?;
    let engine = Engine::open(&root, &EngineOptions::default())?;
    let layers_n = engine.model().new_state().layers.len();
    let layers = match &a.layers {
        Some(l) => {
            anyhow::ensure!(
                l.len() == 3 && l[0] < l[1] && l[1] < l[2] && l[2] < layers_n,
                "--layers takes three ascending layers below {layers_n}, got {l:?}"
            );
            [l[0], l[1], l[2]]
        }
        None => default_layers(layers_n),
    };
    let work = a.work.clone().unwrap_or_else(|| {
        a.out
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("drafter-work")
    });
    let vocab = engine.model().vocab_size();
    let o = DrafterTrainOptions {
        texts: a.texts.clone(),
        work,
        prompts: a.prompts,
        new_tokens: a.new_tokens,
        chat_every: a.chat_every,
        layers,
        draft_steps: a.draft_steps.max(1),
        draft_vocab: a.draft_vocab.unwrap_or(vocab),
        intermediate: a.intermediate.unwrap_or(0),
        heads: a.heads,
        steps: a.steps,
        batch: a.batch,
        lr: a.lr,
        warmup: a.warmup,
        seed: a.seed,
        checkpoint_every: 100,
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    let _ = ctrlc::set_handler(move || c.store(true, Ordering::Relaxed));
    let t = train_drafter(
        engine.model(),
        engine.tokenizer(),
        &engine.stop_ids(),
        &o,
        &cancel,
    )?;
    if t.report.interrupted {
        eprintln!(
            "stopped at step {}; run the same command again to resume from {}",
            t.report.steps,
            o.work.display()
        );
    } else {
        let dtype = if a.f32 {
            WeightDtype::F32
        } else {
            WeightDtype::Bf16
        };
        export(&t.net, &t.vocab, &layers, dtype, &a.out)
            .with_context(|| format!("writing the head to {}", a.out.display()))?;
        let argv: Vec<String> = std::env::args().collect();
        let record = serde_json::json!({"command": argv, "options": &o, "report": &t.report});
        let report = serde_json::to_vec_pretty(&record)?;
        deltafin::fsio::atomic::write_atomic(&a.out.join("TRAINING.json"), &report)?;
        eprintln!("wrote the EAGLE-3 head to {}", a.out.display());
    }
    println!("{}", serde_json::to_string(&t.report)?);
    Ok(())
}
