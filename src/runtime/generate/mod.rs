//! `Generator`: prefill, greedy decode loop, stop rules, cancellation, streaming callback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::runtime::model::{Forward, Model, Output};
use crate::runtime::state::SeqState;
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
    /// Prompt tokens a prompt-cache entry supplied (not prefilled).
    pub cached: usize,
}

mod decode;
pub mod draft;
pub mod sample;
mod seq;
pub mod spec;

pub use decode::Pass;
pub use draft::{Drafter, NgramDrafter, TextDrafter, TextModel};
pub use seq::{Io, SeqDecoder};
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
    model: &'m dyn Model,
}

impl<'m> Generator<'m> {
    /// A generator over `model`.
    pub fn new(model: &'m dyn Model) -> Self {
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
        let mut out = Generation::empty(prompt);
        if opts.max_new == 0 {
            return Ok(out);
        }
        if cancel.load(Ordering::Relaxed) {
            out.stop = StopReason::Cancelled;
            return Ok(out);
        }
        let t0 = Instant::now();
        let prefill = Forward {
            cancel: Some(cancel),
            observer: drafter.observer(),
            ..Default::default()
        };
        let Some(Output { logits, .. }) = self.model.run(prompt, state, &prefill)? else {
            out.stop = StopReason::Cancelled;
            out.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
            return Ok(out);
        };
        let logits = logits.to_vec1::<f32>()?;
        out.prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
        self.decode(
            state,
            logits,
            opts,
            cancel,
            choose,
            drafter,
            &mut on_token,
            out,
        )
    }

    /// Decodes after a prefill done elsewhere (a prompt-cache resume): `state` holds the
    /// prompt, `logits` are its last position's. The same tokens as `generate_with` on a state
    /// prefilled the same way. A drafter that taps the target starts from the first decode
    /// pass (it saw no prefill).
    #[allow(clippy::too_many_arguments)]
    pub fn decode_from(
        &self,
        state: &mut SeqState,
        prompt: &[u32],
        logits: Vec<f32>,
        prefill_ms: f64,
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        drafter: &mut dyn Drafter,
        mut on_token: impl FnMut(u32),
    ) -> Result<Generation> {
        let mut out = Generation::empty(prompt);
        out.prefill_ms = prefill_ms;
        if opts.max_new == 0 {
            return Ok(out);
        }
        if cancel.load(Ordering::Relaxed) {
            out.stop = StopReason::Cancelled;
            return Ok(out);
        }
        self.decode(
            state,
            logits,
            opts,
            cancel,
            choose,
            drafter,
            &mut on_token,
            out,
        )
    }

    /// The decoding loop from the prompt's last logits: `SeqDecoder` between single passes.
    #[allow(clippy::too_many_arguments)]
    fn decode(
        &self,
        state: &mut SeqState,
        logits: Vec<f32>,
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        choose: &mut dyn FnMut(&[f32]) -> u32,
        drafter: &mut dyn Drafter,
        on_token: &mut dyn FnMut(u32),
        out: Generation,
    ) -> Result<Generation> {
        let mut d = SeqDecoder::new(self.model, out, &logits, opts);
        let mut pass = Pass::first(logits);
        let mut io = Io {
            choose,
            on_token,
            cancel,
        };
        let mut drafted = false;
        while !d.absorb(self.model, state, pass, drafter, io.reborrow())? {
            // The drafter's time counts as the pass's: the depth controller weighs both. Not
            // its first proposal's, which reads the whole prompt once (a cost of the prompt,
            // not of the depth).
            let ((ids, drafts), mut draft_secs) = spec::timed(|| d.next_ids(state, drafter));
            if !drafts.is_empty() && !drafted {
                (drafted, draft_secs) = (true, 0.0);
            }
            // One step without drafts; a verify pass (with its undo record) with them.
            let f = Forward {
                undo: !drafts.is_empty(),
                observer: drafter.observer(),
                ..Default::default()
            };
            let (r, secs) = spec::timed(|| self.model.run(&ids, state, &f));
            let out = r?.ok_or_else(|| crate::Error::Msg("a decode pass was cancelled".into()))?;
            pass = Pass::from_output(out, drafts, secs + draft_secs)?;
        }
        Ok(d.finish())
    }
}

impl Generation {
    /// Nothing generated yet for `prompt`.
    /// Nothing generated yet for `prompt` (stop reason `Length`, no timings).
    pub fn empty(prompt: &[u32]) -> Self {
        Generation {
            prompt_ids: prompt.to_vec(),
            generated_ids: Vec::new(),
            first_step_top: Vec::new(),
            stop: StopReason::Length,
            prefill_ms: 0.0,
            decode_ms: 0.0,
            spec: SpecStats::default(),
            cached: 0,
        }
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
