//! Prefill and greedy decode of a model timed as it runs, the figure every speed bench starts
//! from. Owns the timing loop; the caller picks the model's options and reports the figures.

use std::time::Instant;

use super::Stats;
use crate::runtime::generate::argmax;
use crate::{Model, Result};

/// What `time_forward` measures.
#[derive(Debug, Clone)]
pub struct ForwardBenchOptions {
    /// Prompt length (the ids are a fixed pseudo-random sequence below the vocabulary).
    pub prompt_len: usize,
    /// Greedy decode steps per run.
    pub decode: usize,
    /// Timed runs, after one warm-up run that is not counted.
    pub runs: usize,
}

/// Prefill ms per prompt token and decode ms per token over `o.runs` runs, each on a fresh
/// state, after one warm-up run (caches: expert bytes, page cache, thread pools).
pub fn time_forward(model: &dyn Model, o: &ForwardBenchOptions) -> Result<(Stats, Stats)> {
    let vocab = model.vocab_size() as u32;
    let prompt: Vec<u32> = (0..o.prompt_len.max(1) as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let (mut pre, mut dec) = (Vec::new(), Vec::new());
    for _ in 0..o.runs.max(1) + 1 {
        let mut st = model.new_state();
        let t0 = Instant::now();
        let mut logits = model.forward(&prompt, &mut st)?.to_vec1::<f32>()?;
        pre.push(t0.elapsed().as_secs_f64() * 1e3 / prompt.len() as f64);
        let t1 = Instant::now();
        for _ in 0..o.decode {
            logits = model
                .forward(&[argmax(&logits)], &mut st)?
                .to_vec1::<f32>()?;
        }
        dec.push(t1.elapsed().as_secs_f64() * 1e3 / o.decode.max(1) as f64);
    }
    Ok((Stats::of(pre[1..].to_vec()), Stats::of(dec[1..].to_vec())))
}
