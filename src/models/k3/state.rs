//! `SeqState`: every per-sequence state of the model. Buffers are shared copy-on-write, so a
//! snapshot is a cheap clone and restoring it continues bit-identically. A `Mark` is the
//! lighter record a cancellable prefill keeps: MLA caches only grow, so their lengths suffice,
//! and only the KDA states are shared (at most one copy of them while the pass runs).

use super::kda::KdaState;
use super::mla::MlaState;

/// State of one layer's attention.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// KDA conv histories and recurrent matrix.
    Kda(KdaState),
    /// MLA latent cache.
    Mla(MlaState),
}

/// All per-sequence state.
#[derive(Debug, Clone)]
pub struct SeqState {
    /// Positions consumed so far.
    pub pos: usize,
    /// One entry per layer.
    pub layers: Vec<LayerState>,
}

impl SeqState {
    /// A cheap copy that shares every buffer (copy-on-write).
    pub fn snapshot(&self) -> SeqState {
        self.clone()
    }

    /// Returns to a snapshot.
    pub fn restore(&mut self, snap: &SeqState) {
        *self = snap.clone();
    }
}

/// Where one layer stood at a `Mark`.
#[derive(Debug)]
enum LayerMark {
    Kda(KdaState),
    Mla(usize),
}

/// Where a sequence stood before a call that may stop part-way (`SeqState::rewind`).
#[derive(Debug)]
pub struct Mark {
    pos: usize,
    layers: Vec<LayerMark>,
}

impl SeqState {
    /// Records the current position: the KDA states (shared) and the MLA cache lengths.
    pub fn mark(&self) -> Mark {
        Mark {
            pos: self.pos,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Kda(k) => LayerMark::Kda(k.clone()),
                    LayerState::Mla(m) => LayerMark::Mla(m.cache.len()),
                })
                .collect(),
        }
    }

    /// Returns to `mark`, dropping every position consumed since (bit-identical to never having
    /// consumed them).
    pub fn rewind(&mut self, mark: Mark) {
        self.pos = mark.pos;
        for (l, m) in self.layers.iter_mut().zip(mark.layers) {
            match (l, m) {
                (LayerState::Kda(k), LayerMark::Kda(old)) => *k = old,
                (LayerState::Mla(s), LayerMark::Mla(len)) => s.cache.truncate(len),
                // A mark is only taken from this state, so the kinds always match.
                _ => {}
            }
        }
    }
}
