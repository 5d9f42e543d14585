//! The training loop: seeded batches from the token stream, cross-entropy, candle-nn's AdamW
//! with warm-up and cosine decay, gradient clipping, the noaux_tc router-bias nudge, a progress
//! bar with loss and tokens/s, checkpoints (atomic) to resume from, Ctrl-C that checkpoints and
//! stops, and the fp32 held-out NLL the exported checkpoint is judged against.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle::{DType, Device, Tensor};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};

use super::data::{batch_windows, stream};
use super::{config_json, Dims, Net};
use crate::eval::eval_windows;
use crate::fsio::atomic::write_atomic;
use crate::models::k3::config::K3Config;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// What `train` does.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainOptions {
    /// Training text files.
    pub texts: Vec<PathBuf>,
    /// Directory with `tiktoken.model` and `tokenizer_config.json`.
    pub tokenizer: PathBuf,
    /// Where checkpoints go (`weights.safetensors`, `state.json`).
    pub work: PathBuf,
    /// Model dimensions.
    pub dims: Dims,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Share of paragraphs framed as chat turns.
    pub chat_fraction: f64,
    /// noaux_tc bias step per update.
    pub bias_rate: f64,
    /// Seed of the initialisation, the chat framing and the batches.
    pub seed: u64,
    /// Steps between checkpoints.
    pub checkpoint_every: usize,
}

/// What a run did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TrainReport {
    /// Steps done in total (including those before a resume).
    pub steps: usize,
    /// Tokens trained on in total.
    pub tokens: u64,
    /// Wall seconds of this run.
    pub seconds: f64,
    /// Mean loss over the last 50 steps.
    pub final_loss: f64,
    /// Whether the run stopped early (Ctrl-C).
    pub interrupted: bool,
    /// `(first step, options)` of every run that trained the checkpoint, oldest first.
    pub history: Vec<(usize, TrainOptions)>,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct State {
    step: usize,
    tokens: u64,
    options: TrainOptions,
    /// `(first step, options)` of every run that trained this checkpoint, oldest first.
    #[serde(default)]
    history: Vec<(usize, TrainOptions)>,
}

fn lr_at(o: &TrainOptions, step: usize) -> f64 {
    crate::training::cosine_lr(o.lr, o.warmup, o.steps, step)
}

/// Saves the network and the loop state into `work`, each file atomically.
fn save(net: &Net, work: &Path, state: &State) -> Result<()> {
    std::fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    let bytes = crate::training::f32_safetensors(&net.named_values()?)?;
    write_atomic(&work.join("weights.safetensors"), &bytes)?;
    let json = serde_json::to_vec_pretty(state).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&work.join("state.json"), &json)
}

/// The network of a training run: resumed from `work` when it holds a checkpoint of the same
/// dimensions, else freshly initialised. Returns it with the step and token count reached.
fn open_net(o: &TrainOptions, cfg: &K3Config) -> Result<(Net, State)> {
    let mut net = Net::init(cfg, o.seed, &Device::Cpu)?;
    let state_path = o.work.join("state.json");
    if !state_path.exists() {
        let st = State {
            step: 0,
            tokens: 0,
            options: o.clone(),
            history: vec![(0, o.clone())],
        };
        return Ok((net, st));
    }
    let text = std::fs::read(&state_path).map_err(|e| Error::io(&state_path, e))?;
    let mut st: State = serde_json::from_slice(&text)
        .map_err(|e| Error::Msg(format!("{}: {e}", state_path.display())))?;
    if st.options.dims != o.dims || st.options.seed != o.seed {
        return Err(Error::Msg(format!(
            "{} holds a run with other dimensions or seed; give another --work directory or remove it",
            o.work.display()
        )));
    }
    let w = o.work.join("weights.safetensors");
    let named: HashMap<String, Tensor> = candle::safetensors::load(&w, &Device::Cpu)
        .map_err(|e| Error::Msg(format!("{}: {e}", w.display())))?;
    net.load_values(&named)?;
    tracing::info!("resuming from step {} ({})", st.step, o.work.display());
    if st.history.last().map(|h| &h.1) != Some(o) {
        st.history.push((st.step, o.clone()));
    }
    st.options = o.clone();
    Ok((net, st))
}

/// The K3 config of a run: `o.dims` with the tokenizer's rank count.
pub fn run_config(o: &TrainOptions, tok: &Tokenizer) -> Result<(serde_json::Value, K3Config)> {
    let json = config_json(&o.dims, tok.num_ranks());
    let root = serde_json::from_value(json.clone()).map_err(|e| Error::Msg(e.to_string()))?;
    Ok((json, K3Config::from_root(root)?))
}

/// One optimiser step on step `step`'s batch, then the router-bias nudge; returns the loss.
fn train_step(
    o: &TrainOptions,
    net: &mut Net,
    opt: &mut AdamW,
    tokens: &[u32],
    step: usize,
    k: f64,
) -> Result<f64> {
    opt.set_learning_rate(lr_at(o, step));
    let wins = batch_windows(tokens, step, o.batch, o.seq, o.seed);
    let (ids, tgt): (Vec<u32>, Vec<u32>) = wins
        .iter()
        .flat_map(|w| w[..o.seq].iter().copied().zip(w[1..].iter().copied()))
        .unzip();
    let ids = Tensor::from_vec(ids, (o.batch, o.seq), &Device::Cpu)?;
    let tgt = Tensor::from_vec(tgt, o.batch * o.seq, &Device::Cpu)?;
    let pass = net.forward(&ids)?;
    let loss = candle_nn::loss::cross_entropy(&pass.logits, &tgt)?;
    let mut grads = loss.backward()?;
    crate::training::clip_grads(net.vars.values(), &mut grads, 1.0)?;
    opt.step(&grads)?;
    // noaux_tc: nudge each router bias against its expert's load, no auxiliary loss.
    let n = (o.batch * o.seq) as f64;
    for (l, load) in &pass.loads {
        let mean = n * k / load.len() as f64;
        let nudge: Vec<f32> = load
            .iter()
            .map(|&c| (o.bias_rate * (mean - c as f64).signum()) as f32)
            .collect();
        if let Some(b) = net.biases.get_mut(l) {
            *b = (&*b + Tensor::new(nudge, &Device::Cpu)?)?;
        }
    }
    Ok(loss.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

/// Trains (or resumes) per `o`; returns the network and what the run did. Stops early, after a
/// checkpoint, when `cancel` is set.
pub fn train(o: &TrainOptions, cancel: &AtomicBool) -> Result<(Net, TrainReport)> {
    crate::training::keep_freed_memory();
    let tok = Tokenizer::from_dir(&o.tokenizer)?;
    let (_, cfg) = run_config(o, &tok)?;
    let mut text = String::new();
    for p in &o.texts {
        text.push_str(&std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?);
        text.push_str("\n\n");
    }
    let tokens = stream(&tok, &text, o.chat_fraction, o.seed)?;
    tracing::info!("training stream: {} tokens", tokens.len());
    let (mut net, mut st) = open_net(o, &cfg)?;
    let (start, mut seen) = (st.step, st.tokens);
    let params = ParamsAdamW {
        lr: o.lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let mut opt = AdamW::new(net.all_vars(), params)?;
    let bar = crate::progress::Bar::new(
        o.steps as u64,
        "{bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
        true,
    );
    bar.set_position(start as u64);
    let t0 = Instant::now();
    let mut recent: Vec<f64> = Vec::new();
    let mut step = start;
    let k = cfg.text().num_experts_per_token as f64;
    let mut interrupted = false;
    while step < o.steps {
        if cancel.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        let lv = train_step(o, &mut net, &mut opt, &tokens, step, k)?;
        let n = (o.batch * o.seq) as f64;
        recent.push(lv);
        if recent.len() > 50 {
            recent.remove(0);
        }
        step += 1;
        seen += n as u64;
        let mean = recent.iter().sum::<f64>() / recent.len() as f64;
        let tps = ((step - start) * o.batch * o.seq) as f64 / t0.elapsed().as_secs_f64();
        bar.set_message(format!("loss {mean:.3}  {tps:.0} tok/s"));
        if bar.is_hidden() && step % 50 == 0 {
            // No terminal (a log file): a line now and then instead of the bar.
            eprintln!("step {step}/{}: loss {mean:.3}, {tps:.0} tok/s", o.steps);
        }
        bar.set_position(step as u64);
        if step % o.checkpoint_every.max(1) == 0 {
            (st.step, st.tokens) = (step, seen);
            save(&net, &o.work, &st)?;
        }
    }
    (st.step, st.tokens) = (step, seen);
    save(&net, &o.work, &st)?;
    bar.finish();
    let report = TrainReport {
        steps: step,
        tokens: seen,
        seconds: t0.elapsed().as_secs_f64(),
        final_loss: if recent.is_empty() {
            f64::NAN
        } else {
            recent.iter().sum::<f64>() / recent.len() as f64
        },
        interrupted,
        history: st.history.clone(),
    };
    Ok((net, report))
}

/// Average NLL (nats/token) of `net` over `tokens`, scored in `eval_windows` of `len` (full
/// windows batched 16 at a time).
pub fn heldout_nll(net: &Net, tokens: &[u32], len: usize) -> Result<f64> {
    let mut total = 0f64;
    let mut count = 0usize;
    let wins = eval_windows(tokens, len);
    let (full, short): (Vec<&[u32]>, Vec<&[u32]>) =
        wins.into_iter().partition(|w| w.len() == len + 1);
    let mut groups: Vec<Vec<&[u32]>> = full.chunks(16).map(|c| c.to_vec()).collect();
    groups.extend(short.into_iter().map(|w| vec![w]));
    for g in groups {
        let n = g[0].len() - 1;
        let (ids, tgt): (Vec<u32>, Vec<u32>) = g
            .iter()
            .flat_map(|w| w[..n].iter().copied().zip(w[1..].iter().copied()))
            .unzip();
        let ids = Tensor::from_vec(ids, (g.len(), n), &Device::Cpu)?;
        let tgt = Tensor::from_vec(tgt, g.len() * n, &Device::Cpu)?;
        let logits = net.forward(&ids)?.logits.detach();
        let l = candle_nn::loss::cross_entropy(&logits, &tgt)?.to_scalar::<f32>()?;
        total += l as f64 * (g.len() * n) as f64;
        count += g.len() * n;
    }
    Ok(total / count.max(1) as f64)
}
