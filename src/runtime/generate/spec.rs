//! Speculative decoding: the decode loop that verifies drafts (`super::draft`) in one pass of
//! the model, and the depth controller that decides how many to verify.
//!
//! Lossless by construction: each verified row's logits are bit-identical to a single step's
//! (`model::verify`), and the chooser is called once per emitted token, in order, on those
//! logits, exactly as plain decoding calls it. A draft is accepted when the chooser picks it.
//! For greedy decoding that is argmax acceptance. For sampling it is the standard rule for a
//! point-mass draft x, with the draw coupled to plain decoding's: one uniform draw u picks a
//! token t from p; t = x happens with probability p(x) (accept), and otherwise t is a sample of
//! p with x removed and renormalised. So a seeded request emits the same tokens with
//! speculation on or off, and the distribution is p's either way.
//!
//! Owns the speculative loop and depth choice; must not touch model internals.

use std::time::Instant;

/// How decoding speculates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SpecMode {
    /// One token per pass.
    Off,
    /// The n-gram drafter at the full depth whenever it has a proposal.
    Ngram,
    /// The n-gram drafter at the depth the measured acceptance and pass costs favour (0 where
    /// speculation does not pay).
    #[default]
    Auto,
}

impl std::str::FromStr for SpecMode {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        match s {
            "off" => Ok(SpecMode::Off),
            "ngram" => Ok(SpecMode::Ngram),
            "auto" => Ok(SpecMode::Auto),
            _ => Err(crate::Error::Msg(format!(
                "unknown speculation mode {s:?}: use auto, ngram or off"
            ))),
        }
    }
}

/// Speculation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Speculation {
    /// The mode.
    pub mode: SpecMode,
    /// Most drafts verified per pass (1..=`MAX_DEPTH`).
    pub depth: usize,
}

/// Most drafts one verify pass may hold.
pub const MAX_DEPTH: usize = 16;

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            mode: SpecMode::Auto,
            depth: 8,
        }
    }
}

impl Speculation {
    /// No speculation.
    pub const OFF: Speculation = Speculation {
        mode: SpecMode::Off,
        depth: 0,
    };
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Decode passes (single steps and verify passes).
    pub passes: usize,
    /// Verify passes (passes with at least one draft).
    pub verify_passes: usize,
    /// Drafts verified.
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Tokens emitted by decode passes (the first token, from the prefill, is not counted).
    pub emitted: usize,
    /// Largest rollback record of one pass, in bytes.
    pub rollback_bytes: usize,
}

impl SpecStats {
    /// Tokens emitted per decode pass.
    pub fn tokens_per_pass(&self) -> f64 {
        self.emitted as f64 / self.passes.max(1) as f64
    }

    /// Share of drafts accepted.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }
}

/// Chooses the number of drafts per pass from measured rates: a pass of `r` rows costs
/// `t1 + (r − 1)·b` (the fixed part, what the pass reads, and the per-row compute, both
/// measured as exponential averages); the draft at position `i` of a proposal is accepted, when
/// every draft before it was, with probability `α_i` (measured per position), so `k` drafts
/// emit `1 + Σ_{j≤k} Π_{i≤j} α_i` tokens on average; the depth with the most tokens per second
/// wins, 0 included.
#[derive(Debug, Clone)]
pub struct DepthController {
    spec: Speculation,
    /// Seconds of a one-row pass.
    t1: Option<f64>,
    /// Extra seconds per extra row.
    per_row: Option<f64>,
    /// Per draft position: accepted and judged drafts (decayed counts).
    acc: [(f64, f64); MAX_DEPTH],
    /// Passes since the last verify pass (a re-probe every `PROBE` keeps the rates current).
    since_verify: usize,
}

const DECAY: f64 = 0.9;
const PROBE: usize = 64;

impl DepthController {
    /// A controller for `spec`.
    pub fn new(spec: Speculation) -> Self {
        DepthController {
            spec,
            t1: None,
            per_row: None,
            // A prior of one in two, worth two drafts.
            acc: [(1.0, 2.0); MAX_DEPTH],
            since_verify: 0,
        }
    }

    /// The acceptance estimate of the draft at `position` (0-based) given every earlier one
    /// was accepted.
    pub fn alpha(&self, position: usize) -> f64 {
        let (a, n) = self.acc[position.min(MAX_DEPTH - 1)];
        a / n.max(1e-9)
    }

    /// Tokens a pass with `k` drafts emits on average (the pass's own token included).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut reach = 1.0;
        let mut tokens = 1.0;
        for i in 0..k {
            reach *= self.alpha(i);
            tokens += reach;
        }
        tokens
    }

    /// Drafts to ask for in the next pass.
    pub fn depth(&self) -> usize {
        let max = self.spec.depth.min(MAX_DEPTH);
        match self.spec.mode {
            SpecMode::Off => 0,
            SpecMode::Ngram => max,
            SpecMode::Auto => {
                let (Some(t1), Some(b)) = (self.t1, self.per_row) else {
                    // Measure a single step first, then one wide pass.
                    return if self.t1.is_some() { max.min(2) } else { 0 };
                };
                let best = (0..=max)
                    .map(|k| (k, self.expected_tokens(k) / (t1 + k as f64 * b)))
                    .fold((0, 0.0), |x, y| if y.1 > x.1 { y } else { x });
                if best.0 == 0 && self.since_verify >= PROBE {
                    1
                } else {
                    best.0
                }
            }
        }
    }

    /// Records a pass of `rows` rows that took `secs`, with `drafted` drafts judged (those
    /// after a rejection or a stop are not) of which the first `accepted` were accepted.
    pub fn record(&mut self, rows: usize, secs: f64, drafted: usize, accepted: usize) {
        let ema = |old: Option<f64>, x: f64| Some(old.map_or(x, |o| DECAY * o + (1.0 - DECAY) * x));
        if rows <= 1 {
            self.t1 = ema(self.t1, secs);
            self.since_verify += 1;
        } else {
            let extra = (secs - self.t1.unwrap_or(secs)).max(0.0) / (rows - 1) as f64;
            self.per_row = ema(self.per_row, extra);
            self.since_verify = 0;
        }
        // Positions before `accepted` succeeded; the one at `accepted`, if judged, failed.
        for (i, acc) in self.acc.iter_mut().enumerate().take(drafted) {
            let ok = if i < accepted { 1.0 } else { 0.0 };
            *acc = (DECAY * acc.0 + ok, DECAY * acc.1 + 1.0);
            if i >= accepted {
                break;
            }
        }
    }
}

/// Times a closure in seconds.
pub(super) fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_follows_acceptance_and_cost() {
        let mut c = DepthController::new(Speculation::default());
        assert_eq!(c.depth(), 0, "a single step is measured first");
        c.record(1, 1.0, 0, 0);
        assert_eq!(c.depth(), 2, "then one wide pass");
        // Rows nearly free (a spine-bound pass), drafts always accepted: the full depth.
        for _ in 0..20 {
            c.record(9, 1.05, 8, 8);
        }
        assert_eq!(c.depth(), 8);
        // Rows as dear as a pass (compute-bound) and drafts rejected: no speculation.
        let mut c = DepthController::new(Speculation::default());
        c.record(1, 1.0, 0, 0);
        for _ in 0..20 {
            c.record(3, 3.0, 2, 0);
        }
        assert_eq!(c.depth(), 0);
        for _ in 0..PROBE {
            c.record(1, 1.0, 0, 0);
        }
        assert_eq!(c.depth(), 1, "a re-probe after {PROBE} single steps");
        // Per position: the first draft always right, the second always wrong: one draft.
        let mut c = DepthController::new(Speculation::default());
        c.record(1, 1.0, 0, 0);
        for _ in 0..40 {
            c.record(9, 1.05, 2, 1);
        }
        assert!(c.alpha(0) > 0.95 && c.alpha(1) < 0.05, "{:?}", c.acc);
        assert_eq!(c.depth(), 1);
        assert!((c.expected_tokens(8) - 2.0).abs() < 0.1);
        assert_eq!(
            DepthController::new(Speculation::OFF).depth(),
            0,
            "off never drafts"
        );
    }
}
