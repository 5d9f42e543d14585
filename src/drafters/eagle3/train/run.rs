//! The drafter's training loop: collect the target's continuations (`data`), split off a
//! held-out tenth, train the unrolled head (`net`) with candle-nn's AdamW (warm-up, cosine
//! decay, clipping; seeded batches), checkpoint atomically to resume from, stop cleanly on
//! Ctrl-C, and export the head in SpecForge's published layout (`export`). Reports each draft
//! step's held-out accuracy: the acceptance the drafter can expect per position.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle::{Device, Tensor};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};

use super::data::{batch, collect, draft_vocab, prompts, Sample};
use super::net::{HeadDims, HeadNet};
use crate::checkpoint::rng::Rng;
use crate::fsio::atomic::write_atomic;
use crate::runtime::model::Model;
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// What `train-drafter` does.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DrafterTrainOptions {
    /// Text the prompts are drawn from.
    pub texts: Vec<PathBuf>,
    /// Where checkpoints go (`weights.safetensors`, `state.json`).
    pub work: PathBuf,
    /// Prompts whose continuations are trained on.
    pub prompts: usize,
    /// Greedy tokens generated per prompt.
    pub new_tokens: usize,
    /// Every n-th prompt is a chat turn (0: none).
    pub chat_every: usize,
    /// The target layers tapped (rows after each, 0-based).
    pub layers: [usize; 3],
    /// Draft steps unrolled in training (the chain length trained for).
    pub draft_steps: usize,
    /// Draft vocabulary size (the target's when at least its vocabulary).
    pub draft_vocab: usize,
    /// The head's MLP width (0: three times the target's hidden size).
    pub intermediate: usize,
    /// Attention heads.
    pub heads: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Samples per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Seed of the prompts, the initialisation and the batches.
    pub seed: u64,
    /// Steps between checkpoints.
    pub checkpoint_every: usize,
}

/// What a run did.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DrafterTrainReport {
    /// Steps done in total (including those before a resume).
    pub steps: usize,
    /// Samples trained on and held out.
    pub samples: (usize, usize),
    /// Greedy tokens in the training samples.
    pub tokens: usize,
    /// Seconds collecting and training (this run).
    pub seconds: (f64, f64),
    /// Mean training loss over the last 20 steps.
    pub final_loss: f64,
    /// Held-out accuracy of each draft step (given the earlier tokens right).
    pub heldout_accuracy: Vec<f64>,
    /// True when Ctrl-C stopped the run (it resumes from the checkpoint).
    pub interrupted: bool,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct State {
    step: usize,
    options: DrafterTrainOptions,
    dims: HeadDims,
    vocab: Vec<u32>,
}

/// The trained head and what it needs to be exported.
pub struct Trained {
    /// The network.
    pub net: HeadNet,
    /// The draft vocabulary (ascending target ids).
    pub vocab: Vec<u32>,
    /// What the run did.
    pub report: DrafterTrainReport,
}

fn save(net: &HeadNet, work: &Path, st: &State) -> Result<()> {
    std::fs::create_dir_all(work).map_err(|e| Error::io(work, e))?;
    let named: Vec<(String, Tensor)> = net
        .vars
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    write_atomic(
        &work.join("weights.safetensors"),
        &crate::training::f32_safetensors(&named)?,
    )?;
    let json = serde_json::to_vec_pretty(st).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&work.join("state.json"), &json)
}

/// Resumes from `work` when it holds a run of the same options (but the step count), else
/// initialises.
fn open(o: &DrafterTrainOptions, dims: HeadDims, vocab: &[u32]) -> Result<(HeadNet, usize)> {
    let net = HeadNet::init(dims, o.seed, &Device::Cpu)?;
    let path = o.work.join("state.json");
    if !path.exists() {
        return Ok((net, 0));
    }
    let text = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let st: State = serde_json::from_slice(&text).map_err(|e| Error::Json {
        path: path.clone(),
        source: e,
    })?;
    let same = DrafterTrainOptions {
        steps: o.steps,
        checkpoint_every: o.checkpoint_every,
        ..st.options.clone()
    };
    if same != *o || st.dims != dims || st.vocab != vocab {
        return Err(Error::Msg(format!(
            "{} holds a run with other options; give another --work directory or remove it",
            o.work.display()
        )));
    }
    let w = o.work.join("weights.safetensors");
    let named: HashMap<String, Tensor> = candle::safetensors::load(&w, &Device::Cpu)
        .map_err(|e| Error::Msg(format!("{}: {e}", w.display())))?;
    for (n, v) in &net.vars {
        let t = named
            .get(n)
            .ok_or_else(|| Error::Msg(format!("{}: no tensor {n}", w.display())))?;
        v.set(t)?;
    }
    tracing::info!("resuming from step {} ({})", st.step, o.work.display());
    Ok((net, st.step))
}

/// Held-out accuracy per draft step.
fn heldout(
    net: &HeadNet,
    held: &[Sample],
    o: &DrafterTrainOptions,
    vocab: &[u32],
) -> Result<Vec<f64>> {
    let (mut hits, mut n) = (vec![0f64; o.draft_steps], vec![0f64; o.draft_steps]);
    let width = held
        .first()
        .map_or(0, |s| s.taps.len() / (s.ids.len() - 1).max(1));
    for chunk in held.chunks(o.batch.max(1)) {
        let refs: Vec<&Sample> = chunk.iter().collect();
        let b = batch(&refs, o.draft_steps, vocab, width)?;
        let (_, acc) = net.loss(&b, o.draft_steps)?;
        for (j, a) in acc.iter().enumerate() {
            let w = b.labels[j].1.sum_all()?.to_scalar::<f32>()? as f64;
            hits[j] += a * w;
            n[j] += w;
        }
    }
    Ok(hits.iter().zip(&n).map(|(h, n)| h / n.max(1.0)).collect())
}

/// Collects the continuations of the target `model` (its tokenizer `tok`; replies end at
/// `stop_ids`) and trains (or resumes) per `o`. Stops early, after a checkpoint, when `cancel`
/// is set.
pub fn train_drafter(
    model: &dyn Model,
    tok: &Tokenizer,
    stop_ids: &[u32],
    o: &DrafterTrainOptions,
    cancel: &AtomicBool,
) -> Result<Trained> {
    crate::training::keep_freed_memory();
    let mut text = String::new();
    for p in &o.texts {
        text.push_str(&std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?);
        text.push_str("\n\n");
    }
    let t0 = Instant::now();
    let ps = prompts(model, tok, &text, o.prompts, o.chat_every, o.seed)?;
    let bar = crate::progress::Bar::new(
        ps.len() as u64,
        "collecting {bar:30} {pos}/{len} continuations  [{elapsed_precise} < {eta_precise}]",
        true,
    );
    let mut samples = collect(
        model,
        stop_ids,
        &ps,
        o.new_tokens,
        &o.layers,
        cancel,
        |_| bar.inc(1),
    )?;
    bar.finish();
    if cancel.load(Ordering::Relaxed) {
        return Err(Error::Msg(
            "stopped while collecting the target's continuations".into(),
        ));
    }
    let collect_s = t0.elapsed().as_secs_f64();
    let held = samples.split_off(samples.len() - (samples.len() / 10).max(1));
    let vocab_size = model.vocab_size();
    let vocab = draft_vocab(&samples, vocab_size, o.draft_vocab);
    let width = samples[0].taps.len() / (samples[0].ids.len() - 1);
    let hidden = width / 3;
    let dims = HeadDims {
        hidden,
        target_hidden: hidden,
        heads: o.heads,
        head_dim: hidden / o.heads.max(1),
        intermediate: if o.intermediate == 0 {
            3 * hidden
        } else {
            o.intermediate
        },
        vocab: vocab_size,
        draft_vocab: vocab.len(),
    };
    let (net, start) = open(o, dims, &vocab)?;
    let mut opt = AdamW::new(
        net.all_vars(),
        ParamsAdamW {
            lr: o.lr,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.01,
        },
    )?;
    let st = |step| State {
        step,
        options: o.clone(),
        dims,
        vocab: vocab.clone(),
    };
    let bar = crate::progress::Bar::new(
        o.steps as u64,
        "training {bar:30} {pos}/{len} steps  {msg}  [{elapsed_precise} < {eta_precise}]",
        true,
    );
    bar.set_position(start as u64);
    let (t1, mut recent, mut step, mut interrupted) = (Instant::now(), Vec::new(), start, false);
    let per_epoch = samples.len().div_ceil(o.batch.max(1));
    while step < o.steps {
        if cancel.load(Ordering::Relaxed) {
            interrupted = true;
            break;
        }
        // Seeded per epoch: a resumed run draws the same batches.
        let (epoch, at) = (step / per_epoch, step % per_epoch);
        let mut order: Vec<usize> = (0..samples.len()).collect();
        let mut rng = Rng::new(o.seed ^ (epoch as u64 + 1).wrapping_mul(0x9E37));
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let pick: Vec<&Sample> = order
            .iter()
            .skip(at * o.batch)
            .take(o.batch)
            .map(|&i| &samples[i])
            .collect();
        let b = batch(&pick, o.draft_steps, &vocab, width)?;
        opt.set_learning_rate(crate::training::cosine_lr(o.lr, o.warmup, o.steps, step));
        let (loss, acc) = net.loss(&b, o.draft_steps)?;
        let mut grads = loss.backward()?;
        crate::training::clip_grads(net.vars.values(), &mut grads, 1.0)?;
        opt.step(&grads)?;
        recent.push(loss.to_scalar::<f32>()? as f64);
        if recent.len() > 20 {
            recent.remove(0);
        }
        step += 1;
        let mean = recent.iter().sum::<f64>() / recent.len() as f64;
        let accs: Vec<String> = acc.iter().map(|a| format!("{:.2}", a)).collect();
        bar.set_message(format!("loss {mean:.3}  acc {}", accs.join("/")));
        if bar.is_hidden() && step % 50 == 0 {
            eprintln!(
                "step {step}/{}: loss {mean:.3}, accuracy per draft step {}",
                o.steps,
                accs.join("/")
            );
        }
        bar.set_position(step as u64);
        if step % o.checkpoint_every.max(1) == 0 {
            save(&net, &o.work, &st(step))?;
        }
    }
    save(&net, &o.work, &st(step))?;
    bar.finish();
    let heldout_accuracy = heldout(&net, &held, o, &vocab)?;
    let tokens = samples.iter().map(|s| s.ids.len() - s.prompt_len).sum();
    let report = DrafterTrainReport {
        steps: step,
        samples: (samples.len(), held.len()),
        tokens,
        seconds: (collect_s, t1.elapsed().as_secs_f64()),
        final_loss: recent.iter().sum::<f64>() / recent.len().max(1) as f64,
        heldout_accuracy,
        interrupted,
    };
    Ok(Trained { net, vocab, report })
}
