//! `SeqState`: every per-sequence state of the model. Buffers are shared copy-on-write, so a
//! snapshot is a cheap clone and restoring it continues bit-identically.

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
