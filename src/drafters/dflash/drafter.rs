//! `DFlashDrafter`: a DFlash head as the decoding loop's `Drafter`. The target's pass reports
//! its hidden rows to a `HiddenTap` (no second target pass); before each proposal the drafter
//! reads the rows of the positions the target now holds into the head's context (a verify
//! pass's rejected rows are dropped) and drafts one block after the last emitted token: one
//! head pass for up to `block_size − 1` tokens (`block_size` when the head samples from the
//! anchor). For one sequence at a time. Owns that bookkeeping; the verify pass decides what is
//! kept, so the drafter changes the speed, never the output.

use std::sync::Arc;

use super::head::{ContextCache, DFlashHead};
use crate::runtime::generate::Drafter;
use crate::runtime::observe::Observer;
use crate::runtime::observers::{HiddenTap, Tapped};

/// Most target rows held between proposals (as for EAGLE-3's drafter).
const TAP_ROWS: usize = 4096;

/// A DFlash head drafting for a target whose passes `tap` watches.
pub struct DFlashDrafter {
    head: Arc<DFlashHead>,
    tap: Arc<HiddenTap>,
    cache: ContextCache,
}

impl DFlashDrafter {
    /// A drafter over `head`; its tap watches the passes the decoding loop runs with it.
    pub fn new(head: Arc<DFlashHead>) -> Self {
        let tap = Arc::new(HiddenTap::with_limit(&head.config().tap_layers, TAP_ROWS));
        DFlashDrafter {
            head,
            tap,
            cache: ContextCache::default(),
        }
    }

    /// The tap on the target's passes, to attach to a pass run outside the decoding loop.
    pub fn tap(&self) -> &Arc<HiddenTap> {
        &self.tap
    }

    /// Reads the rows the tap saw since the last call into the context at their positions
    /// (re-run positions replace what was there; a gap starts over), then keeps those of the
    /// `valid` positions the target holds.
    fn absorb(&mut self, valid: usize) {
        let got: Vec<Tapped> = self.tap.take();
        let cfg = self.head.config();
        let h = cfg.hidden;
        let by_layer: Vec<&Tapped> = cfg
            .tap_layers
            .iter()
            .filter_map(|l| got.iter().find(|t| t.layer == *l && t.width == h))
            .collect();
        if by_layer.len() == cfg.tap_layers.len() {
            let rows = by_layer.iter().map(|t| t.rows.len() / h).min().unwrap_or(0);
            let first = by_layer[0].first;
            if first < self.cache.start() || first > self.cache.end() {
                self.cache = ContextCache::starting_at(first);
            }
            self.cache.truncate_to(first);
            let fused: Vec<f32> = (0..rows)
                .flat_map(|r| by_layer.iter().flat_map(move |t| &t.rows[r * h..][..h]))
                .copied()
                .collect();
            if rows > 0 && self.head.extend(&fused, &mut self.cache).is_err() {
                self.cache = ContextCache::starting_at(first + rows);
            }
        }
        self.cache.truncate_to(valid);
    }
}

impl Drafter for DFlashDrafter {
    fn observer(&self) -> Option<&dyn Observer> {
        Some(self.tap.as_ref())
    }

    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        // The last emitted token is not in the target yet: it holds `n − 1` positions.
        let Some(valid) = context.len().checked_sub(1) else {
            return Vec::new();
        };
        self.absorb(valid);
        if k == 0 || self.cache.end() != valid {
            return Vec::new();
        }
        let anchor = context[valid];
        match self
            .head
            .block(anchor, &mut self.cache)
            .and_then(|b| self.head.chain(&b, anchor, None))
        {
            Ok((_, mut drafts)) => {
                drafts.truncate(k);
                drafts
            }
            Err(_) => Vec::new(),
        }
    }
}
