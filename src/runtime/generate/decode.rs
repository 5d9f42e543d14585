//! The pieces of one decode loop iteration (`Generator::generate_drafted`): the rows of the
//! last pass (`Pass`), emitting tokens from them until a draft is rejected or generation stops
//! (`Emitter`), and recording what the pass did for the depth controller and the statistics.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{DepthController, Drafter, GenerateOptions, Generation, SpecStats, StopReason};
use crate::runtime::rollback::Rollback;

/// The logits rows of one decode pass, the drafts fed after its first row, and its rollback.
pub struct Pass {
    rows: Vec<Vec<f32>>,
    drafts: Vec<u32>,
    /// What keeps any prefix of a verify pass (`None` for a plain step or the prefill).
    pub rollback: Option<Rollback>,
    secs: f64,
    first: bool,
}

impl Pass {
    /// The prefill's last row.
    pub fn first(logits: Vec<f32>) -> Self {
        Pass {
            rows: vec![logits],
            drafts: Vec::new(),
            rollback: None,
            secs: 0.0,
            first: true,
        }
    }

    /// A decode pass's output (`[V]`, or `[T, V]` with a rollback) that took `secs`.
    pub fn from_output(
        out: crate::runtime::model::Output,
        drafts: Vec<u32>,
        secs: f64,
    ) -> crate::Result<Self> {
        let rows = match out.rollback {
            Some(_) => out.logits.to_vec2::<f32>()?,
            None => vec![out.logits.to_vec1::<f32>()?],
        };
        Ok(Pass::new(rows, drafts, out.rollback, secs))
    }

    /// A decode pass that took `secs`.
    pub fn new(
        rows: Vec<Vec<f32>>,
        drafts: Vec<u32>,
        rollback: Option<Rollback>,
        secs: f64,
    ) -> Self {
        Pass {
            rows,
            drafts,
            rollback,
            secs,
            first: false,
        }
    }

    /// Adds time spent on the pass after it ran (keeping its verified prefix).
    pub fn add_secs(&mut self, secs: f64) {
        self.secs += secs;
    }

    /// Whether this is the prefill's row (no decode pass to record).
    pub fn is_first(&self) -> bool {
        self.first
    }
}

/// Chooses and emits tokens, in order, into the generation.
pub(super) struct Emitter<'a, 'c> {
    pub opts: &'a GenerateOptions,
    pub cancel: &'a AtomicBool,
    pub choose: &'a mut (dyn FnMut(&[f32]) -> u32 + 'c),
    pub on_token: &'a mut dyn FnMut(u32),
    pub out: &'a mut Generation,
    /// The prompt and every emitted token.
    pub context: &'a mut Vec<u32>,
}

/// What emitting one pass's rows did.
pub(super) struct Emitted {
    pub emitted: usize,
    accepted: usize,
    pub stopped: bool,
}

impl Emitter<'_, '_> {
    /// Emits a token per row while each matches its draft; stops at a stop id, `max_new` or a
    /// cancel.
    pub fn rows(&mut self, pass: &Pass) -> Emitted {
        let (mut emitted, mut accepted, mut stopped) = (0usize, 0usize, false);
        for (i, row) in pass.rows.iter().enumerate() {
            let next = (self.choose)(row);
            emitted += 1;
            self.out.generated_ids.push(next);
            self.context.push(next);
            (self.on_token)(next);
            if self.opts.stop_ids.contains(&next) {
                self.out.stop = StopReason::Stop;
                stopped = true;
            } else if self.out.generated_ids.len() >= self.opts.max_new {
                stopped = true;
            } else if self.cancel.load(Ordering::Relaxed) {
                self.out.stop = StopReason::Cancelled;
                stopped = true;
            }
            if stopped || i >= pass.drafts.len() || next != pass.drafts[i] {
                break;
            }
            accepted += 1;
        }
        Emitted {
            emitted,
            accepted,
            stopped,
        }
    }
}

impl Emitted {
    /// Tells the depth controller, the statistics and the drafter what the pass did.
    pub fn record(
        &self,
        pass: &Pass,
        ctl: &mut DepthController,
        s: &mut SpecStats,
        drafter: &mut dyn Drafter,
    ) {
        let (drafts, accepted, emitted) = (pass.drafts.len(), self.accepted, self.emitted);
        let compared = (accepted + usize::from(accepted < emitted && !self.stopped)).min(drafts);
        ctl.record(pass.rows.len(), pass.secs, compared, accepted);
        s.passes += 1;
        s.verify_passes += usize::from(drafts > 0);
        s.drafted += drafts;
        s.accepted += accepted;
        s.emitted += emitted;
        drafter.accepted(drafts, accepted);
    }
}
