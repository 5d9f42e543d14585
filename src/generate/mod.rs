//! `Generator`: prefill, greedy decode loop, stop rules, cancellation, streaming callback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::model::{K3Model, SeqState};
use crate::Result;

/// What ends generation early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token (end of message) was generated.
    Stop,
    /// `max_new` tokens were generated.
    Length,
    /// The cancellation flag was set.
    Cancelled,
}

/// Generation settings.
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_new: usize,
    /// Tokens that end generation (they are included in the output).
    pub stop_ids: Vec<u32>,
    /// Speculative decoding (the output is the same either way).
    pub speculation: Speculation,
}

/// The result of a generation.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Generation {
    /// Prompt tokens.
    pub prompt_ids: Vec<u32>,
    /// Generated tokens.
    pub generated_ids: Vec<u32>,
    /// The 10 highest logits that chose the first generated token, highest first.
    pub first_step_top: Vec<(u32, f32)>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Prefill wall time in ms.
    pub prefill_ms: f64,
    /// Decode wall time in ms (all steps after the first token).
    pub decode_ms: f64,
    /// What speculation did.
    pub spec: SpecStats,
}

pub mod draft;
pub mod sample;
pub mod spec;

pub use draft::{Drafter, NgramDrafter, TextDrafter, TextModel};
pub use spec::{DepthController, SpecMode, SpecStats, Speculation};

/// Index of the first maximal value (NaNs never win).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() && !x.is_nan() {
            best = i;
        }
    }
    best as u32
}

/// The `k` highest entries, highest first (ties: lower index first).
pub fn top_k(v: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.into_iter().take(k).map(|i| (i as u32, v[i])).collect()
}

/// Greedy generation over a model.
pub struct Generator<'m> {
    model: &'m K3Model,
}

impl<'m> Generator<'m> {
    /// A generator over `model`.
    pub fn new(model: &'m K3Model) -> Self {
        Generator { model }
    }

    /// Prefills `prompt` into `state` and decodes greedily; `on_token` sees each new token as it
    /// is chosen; `cancel` is checked between prefill chunks and between tokens. Generation
    /// also stops (`Length`) when the context limit is reached.
    pub fn generate(
        &self,
        state: &mut SeqState,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        self.generate_with(
            state,
            prompt,
            opts,
            cancel,
            &mut |l: &[f32]| argmax(l),
            on_token,
        )
    }

    /// `generate` with a token chooser (greedy, or a `Sampler`), speculating as
    /// `opts.speculation` says with the n-gram drafter.
    pub fn generate_with(
        &self,
        state: &mut SeqState,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        let mut ngram = NgramDrafter::default();
        self.generate_drafted(state, prompt, opts, cancel, choose, &mut ngram, on_token)
    }

    /// `generate_with` with a chosen drafter. The chooser is called once per emitted token, in
    /// order, on logits bit-identical to plain decoding's, so the output does not depend on the
    /// drafter or the speculation settings (`spec` module).
    #[allow(clippy::too_many_arguments)]
    pub fn generate_drafted(
        &self,
        state: &mut SeqState,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        drafter: &mut dyn Drafter,
        mut on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        let mut out = Generation {
            prompt_ids: prompt.to_vec(),
            generated_ids: Vec::new(),
            first_step_top: Vec::new(),
            stop: StopReason::Length,
            prefill_ms: 0.0,
            decode_ms: 0.0,
            spec: SpecStats::default(),
        };
        if opts.max_new == 0 {
            return Ok(out);
        }
        if cancel.load(Ordering::Relaxed) {
            out.stop = StopReason::Cancelled;
            return Ok(out);
        }
        let t0 = Instant::now();
        let Some(logits) = self.model.forward_with(prompt, state, None, Some(cancel))? else {
            out.stop = StopReason::Cancelled;
            out.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            return Ok(out);
        };
        let logits = logits.to_vec1::<f32>()?;
        out.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        out.first_step_top = top_k(&logits, 10);
        let t1 = Instant::now();
        // Expanded MLA (the reference form) is not row-independent: no verify passes there.
        let spec = match self.model.options.mla {
            crate::model::MlaMode::Compact => opts.speculation,
            crate::model::MlaMode::Expanded => spec::Speculation::OFF,
        };
        let mut ctl = DepthController::new(spec);
        let vocab = self.model.config().text().vocab_size;
        let mut context = prompt.to_vec();
        let limit = self.model.context_limit();
        // The rows of the last pass, the drafts fed after its first row, and its rollback.
        let (mut rows, mut drafts, mut rollback) = (vec![logits], Vec::<u32>::new(), None);
        let mut secs = 0.0;
        let mut first = true;
        loop {
            let (mut emitted, mut accepted, mut stopped) = (0usize, 0usize, false);
            for (i, row) in rows.iter().enumerate() {
                let next = choose(row);
                emitted += 1;
                out.generated_ids.push(next);
                context.push(next);
                on_token(next);
                if opts.stop_ids.contains(&next) {
                    out.stop = StopReason::Stop;
                    stopped = true;
                } else if out.generated_ids.len() >= opts.max_new {
                    stopped = true;
                } else if cancel.load(Ordering::Relaxed) {
                    out.stop = StopReason::Cancelled;
                    stopped = true;
                }
                if stopped || i >= drafts.len() || next != drafts[i] {
                    break;
                }
                accepted += 1;
            }
            if let Some(rb) = rollback.take() {
                let rb: crate::model::Rollback = rb;
                out.spec.rollback_bytes = out.spec.rollback_bytes.max(rb.bytes());
                // The state holds every emitted token but the last.
                self.model.keep(rb, state, emitted)?;
            }
            if !first {
                let compared =
                    (accepted + usize::from(accepted < emitted && !stopped)).min(drafts.len());
                ctl.record(rows.len(), secs, compared, accepted);
                let s = &mut out.spec;
                s.passes += 1;
                s.verify_passes += usize::from(!drafts.is_empty());
                s.drafted += drafts.len();
                s.accepted += accepted;
                s.emitted += emitted;
                drafter.accepted(drafts.len(), accepted);
            }
            first = false;
            if stopped || state.pos >= limit {
                break;
            }
            let last = context[context.len() - 1];
            let room = (limit - state.pos).min(opts.max_new - out.generated_ids.len());
            let k = ctl.depth().min(room - 1);
            drafts = if k > 0 {
                let mut d = drafter.propose(&context, k);
                // A draft outside the vocabulary (another tokenizer) ends the proposal.
                let ok = d.iter().take_while(|&&t| (t as usize) < vocab).count();
                d.truncate(k.min(ok));
                d
            } else {
                Vec::new()
            };
            if drafts.is_empty() {
                let (l, t) = spec::timed(|| self.model.forward(&[last], state));
                rows = vec![l?.to_vec1::<f32>()?];
                secs = t;
            } else {
                let ids: Vec<u32> = std::iter::once(last)
                    .chain(drafts.iter().copied())
                    .collect();
                let (r, t) = spec::timed(|| self.model.verify(&ids, state, None));
                let (l, rb) = r?;
                rows = l.to_vec2::<f32>()?;
                rollback = Some(rb);
                secs = t;
            }
        }
        out.decode_ms = t1.elapsed().as_secs_f64() * 1e3;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_takes_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0]), 1);
        assert_eq!(top_k(&[1.0, 3.0, 3.0], 2), vec![(1, 3.0), (2, 3.0)]);
    }
}
