//! `SeqDecoder`: one sequence's decoding between passes, so the passes can be run by whoever
//! holds the sequence: `Generator` (one sequence, one pass at a time) or the batch scheduler
//! (`crate::engine::batch`, the rows of many sequences in one pass). It chooses and emits
//! tokens from a pass's rows (`absorb`), keeps the verified prefix of a verify pass, and says
//! what the next pass must feed (`next_ids`: the last token and the drafts). The same calls in
//! the same order give the same tokens whoever runs the passes.
//!
//! Owns the decode bookkeeping of one sequence; must not run passes or touch model internals.

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::decode::{Emitter, Pass};
use super::{spec, top_k, DepthController, Drafter, GenerateOptions, Generation};
use crate::runtime::model::Model;
use crate::runtime::state::SeqState;
use crate::Result;

/// The caller's side of emitting: the chooser, the token callback and the cancel flag.
pub struct Io<'a, 'c> {
    /// Chooses a token from a row of logits (called once per emitted token, in order).
    pub choose: &'a mut (dyn FnMut(&[f32]) -> u32 + 'c),
    /// Sees each emitted token.
    pub on_token: &'a mut (dyn FnMut(u32) + 'c),
    /// Checked after each emitted token.
    pub cancel: &'a AtomicBool,
}

impl<'c> Io<'_, 'c> {
    /// The same callbacks, borrowed again for one call.
    pub fn reborrow(&mut self) -> Io<'_, 'c> {
        Io {
            choose: &mut *self.choose,
            on_token: &mut *self.on_token,
            cancel: self.cancel,
        }
    }
}

/// One sequence's decoding state between passes.
pub struct SeqDecoder {
    opts: GenerateOptions,
    ctl: DepthController,
    out: Generation,
    /// The prompt and every emitted token.
    context: Vec<u32>,
    started: Instant,
    limit: usize,
    vocab: usize,
}

impl SeqDecoder {
    /// Decoding after a prefill whose last logits are `first` (`out`: the generation so far,
    /// with its prompt and prefill time).
    pub fn new(
        model: &dyn Model,
        mut out: Generation,
        first: &[f32],
        opts: &GenerateOptions,
    ) -> Self {
        out.first_step_top = top_k(first, 10);
        // A model whose verify passes are not row-independent gets none.
        let spec = if model.can_verify() {
            opts.speculation
        } else {
            spec::Speculation::OFF
        };
        SeqDecoder {
            opts: opts.clone(),
            ctl: DepthController::new(spec),
            context: out.prompt_ids.clone(),
            out,
            started: Instant::now(),
            limit: model.context_limit(),
            vocab: model.vocab_size(),
        }
    }

    /// Emits tokens from `pass` (while each matches its draft), keeps the verified prefix of a
    /// verify pass in `state`, and records the pass. Returns whether generation has ended (a
    /// stop token, `max_new`, a cancel or the context limit).
    pub fn absorb(
        &mut self,
        model: &dyn Model,
        state: &mut SeqState,
        mut pass: Pass,
        drafter: &mut dyn Drafter,
        io: Io<'_, '_>,
    ) -> Result<bool> {
        let mut emit = Emitter {
            opts: &self.opts,
            cancel: io.cancel,
            choose: io.choose,
            on_token: io.on_token,
            out: &mut self.out,
            context: &mut self.context,
        };
        let e = emit.rows(&pass);
        if let Some(rb) = pass.rollback.take() {
            self.out.spec.rollback_bytes = self.out.spec.rollback_bytes.max(rb.bytes());
            // The state holds every emitted token but the last. Keeping a prefix costs time
            // (a replay of recurrent state): the pass's cost includes it.
            let t = Instant::now();
            model.keep(rb, state, e.emitted)?;
            pass.add_secs(t.elapsed().as_secs_f64());
        }
        if !pass.is_first() {
            e.record(&pass, &mut self.ctl, &mut self.out.spec, drafter);
        }
        Ok(e.stopped || state.pos >= self.limit)
    }

    /// What the next pass feeds: the last emitted token and the drafts after it (within the
    /// context and token limits). Returns `(ids, drafts)`; a pass with drafts is a verify pass.
    pub fn next_ids(&self, state: &SeqState, drafter: &mut dyn Drafter) -> (Vec<u32>, Vec<u32>) {
        let context = &self.context;
        let last = context[context.len() - 1];
        let room = (self.limit - state.pos).min(self.opts.max_new - self.out.generated_ids.len());
        let k = self.ctl.depth().min(room.saturating_sub(1));
        let drafts = if k > 0 {
            let mut d = drafter.propose(context, k);
            // A draft outside the vocabulary (another tokenizer) ends the proposal.
            let ok = d.iter().take_while(|&&t| (t as usize) < self.vocab).count();
            d.truncate(k.min(ok));
            d
        } else {
            Vec::new()
        };
        let ids = std::iter::once(last)
            .chain(drafts.iter().copied())
            .collect();
        (ids, drafts)
    }

    /// The generation so far.
    pub fn generation(&self) -> &Generation {
        &self.out
    }

    /// Marks the generation cancelled (the caller stopped it between passes).
    pub fn cancel(&mut self) {
        self.out.stop = super::StopReason::Cancelled;
    }

    /// The finished generation, with the decode time since `new`.
    pub fn finish(mut self) -> Generation {
        self.out.decode_ms = self.started.elapsed().as_secs_f64() * 1e3;
        self.out
    }
}
