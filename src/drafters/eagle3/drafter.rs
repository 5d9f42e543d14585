//! `Eagle3Drafter`: an EAGLE-3 head as the decoding loop's `Drafter`. The target's pass reports
//! its hidden rows to a `HiddenTap` (no second target pass); before each proposal the drafter
//! takes the rows of the positions the target now holds (a verify pass's rejected rows are
//! dropped), feeds the head every new position (the embedding of the next token with the
//! target's rows at this one), and chains its own rows for `k` greedy drafts. For one sequence
//! at a time (a batched pass mixes sequences' rows). Owns that bookkeeping; the verify pass
//! (`runtime::generate`) decides what is kept, so the drafter changes the speed, never the
//! output.

use std::sync::Arc;

use super::head::{DraftCache, Eagle3Head, HeadInput};
use crate::runtime::generate::{argmax, Drafter};
use crate::runtime::observe::Observer;
use crate::runtime::observers::{HiddenTap, Tapped};

/// Most target rows held between proposals: a long stretch without drafts (the depth
/// controller turned speculation down) costs at most this many rows per tapped layer.
const TAP_ROWS: usize = 4096;

/// An EAGLE-3 head drafting for a target whose passes `tap` watches.
pub struct Eagle3Drafter {
    head: Arc<Eagle3Head>,
    tap: Arc<HiddenTap>,
    layers: Vec<usize>,
    /// The target position of `taps`' first row.
    base: usize,
    /// Fused tapped rows `[m, 3·Ht]` of target positions `base..base + m` not yet fed.
    taps: Vec<f32>,
    /// The head's cache holds target positions `start..start + fed` (drafts may follow).
    start: usize,
    fed: usize,
    cache: DraftCache,
}

impl Eagle3Drafter {
    /// A drafter over `head` for a target of `target_layers` decoder layers. Its tap watches
    /// the passes the decoding loop runs with it (`Drafter::observer`).
    pub fn new(head: Arc<Eagle3Head>, target_layers: usize) -> Self {
        let layers = head.config().taps(target_layers);
        // Rows past this many since the last proposal are dropped (the head then starts over).
        let tap = Arc::new(HiddenTap::with_limit(&layers, TAP_ROWS));
        Eagle3Drafter {
            head,
            tap,
            layers,
            base: 0,
            taps: Vec::new(),
            start: 0,
            fed: 0,
            cache: DraftCache::default(),
        }
    }

    /// The tap on the target's passes, to attach to a pass run outside the decoding loop
    /// (`Forward::observer`, or `Model::observe` for a single sequence).
    pub fn tap(&self) -> &Arc<HiddenTap> {
        &self.tap
    }

    fn width(&self) -> usize {
        3 * self.head.config().target_hidden
    }

    /// The position after the last row held.
    fn end(&self) -> usize {
        self.base + self.taps.len() / self.width()
    }

    /// Takes the rows the tap saw since the last call, placing them at their positions (rows
    /// re-run from an earlier position replace what was there; a gap starts over), then keeps
    /// those of the `valid` positions the target holds.
    fn absorb(&mut self, valid: usize) {
        let got: Vec<Tapped> = self.tap.take();
        let (ht, w) = (self.head.config().target_hidden, self.width());
        let by_layer: Vec<&Tapped> = self
            .layers
            .iter()
            .filter_map(|l| got.iter().find(|t| t.layer == *l && t.width == ht))
            .collect();
        if by_layer.len() == 3 {
            let rows = by_layer
                .iter()
                .map(|t| t.rows.len() / ht)
                .min()
                .unwrap_or(0);
            let first = by_layer[0].first;
            if first < self.base || first > self.end() || first < self.start + self.fed {
                // Positions the head already consumed were re-run, or a gap: start over.
                self.taps.clear();
                self.base = first;
                self.start = first;
                self.fed = 0;
                self.cache = DraftCache::default();
            }
            self.taps.truncate((first - self.base) * w);
            for r in 0..rows {
                for t in &by_layer {
                    self.taps.extend_from_slice(&t.rows[r * ht..][..ht]);
                }
            }
        }
        let keep = valid.clamp(self.base, self.end());
        self.taps.truncate((keep - self.base) * w);
    }
}

impl Drafter for Eagle3Drafter {
    fn observer(&self) -> Option<&dyn Observer> {
        Some(self.tap.as_ref())
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        // The last emitted token is not in the target yet: it holds `n − 1` positions.
        let valid = context.len().saturating_sub(1);
        self.absorb(valid);
        self.cache.truncate(self.fed);
        let (h, w) = (self.head.config().hidden, self.width());
        let from = self.start + self.fed;
        // Only when the head can reach the position after the last one the target holds.
        if k == 0 || self.end() != valid || from < self.base || from >= valid {
            return Vec::new();
        }
        // Head position t reads the embedding of token t + 1 and the target's rows at t.
        let Ok(embeds) = self.head.embed(&context[from + 1..=valid]) else {
            return Vec::new();
        };
        let taps = &self.taps[(from - self.base) * w..];
        let Ok(mut out) = self
            .head
            .step(&embeds, HeadInput::Taps(taps), &mut self.cache)
        else {
            return Vec::new();
        };
        self.fed = valid - self.start;
        self.taps.clear();
        self.base = valid;
        let vd = self.head.config().draft_vocab;
        let mut drafts = Vec::with_capacity(k);
        loop {
            let t = out.logits.len() / vd;
            let id = self
                .head
                .target_id(argmax(&out.logits[(t - 1) * vd..]) as usize);
            drafts.push(id);
            if drafts.len() == k {
                return drafts;
            }
            let row = out.rows[(t - 1) * h..].to_vec();
            let Ok(e) = self.head.embed(&[id]) else {
                return drafts;
            };
            match self.head.step(&e, HeadInput::Rows(&row), &mut self.cache) {
                Ok(o) => out = o,
                Err(_) => return drafts,
            }
        }
    }
}
