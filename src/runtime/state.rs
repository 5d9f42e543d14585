//! `SeqState`: every per-sequence state of a model on the runtime, in two generic forms a
//! family builds its layers' states from: a row cache (one row per position: attention's keys
//! and values, K3's MLA latent rows) and a fixed-size recurrent state (f32 buffers: K3's KDA
//! conv history and recurrent matrix). Buffers are shared copy-on-write, so a snapshot is a
//! cheap clone and restoring it continues bit-identically. A `Mark` is the lighter record a
//! cancellable prefill keeps: row caches only grow, so their lengths suffice, and the recurrent
//! buffers are shared (at most one copy of them while the pass runs). Owns the state's shape,
//! saving and accounting; what the rows and buffers mean is the family's, and no family's
//! type is named here.

use std::sync::Arc;

use super::row_cache::RowCache;

/// A fixed-size recurrent state: f32 buffers, shared copy-on-write (`Arc::make_mut` to write).
#[derive(Debug, Clone, Default)]
pub struct Recurrent {
    /// The buffers, in the family's order.
    pub buffers: Vec<Arc<Vec<f32>>>,
}

impl Recurrent {
    /// A state of zeroed buffers of `lens` floats each.
    pub fn zeros(lens: &[usize]) -> Recurrent {
        Recurrent {
            buffers: lens.iter().map(|&n| Arc::new(vec![0.0; n])).collect(),
        }
    }
}

/// State of one layer.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// One row per position consumed.
    Rows(RowCache),
    /// A fixed-size recurrent state.
    Recurrent(Recurrent),
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
    Recurrent(Recurrent),
    /// A row cache's length.
    Rows(usize),
}

/// Where a sequence stood before a call that may stop part-way (`SeqState::rewind`).
#[derive(Debug)]
pub struct Mark {
    pos: usize,
    layers: Vec<LayerMark>,
}

impl SeqState {
    /// Records the current position: the recurrent states (shared) and the row cache lengths.
    pub fn mark(&self) -> Mark {
        Mark {
            pos: self.pos,
            layers: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Recurrent(r) => LayerMark::Recurrent(r.clone()),
                    LayerState::Rows(c) => LayerMark::Rows(c.len()),
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
                (LayerState::Recurrent(r), LayerMark::Recurrent(old)) => *r = old,
                (LayerState::Rows(c), LayerMark::Rows(len)) => c.truncate(len),
                // A mark is only taken from this state, so the kinds always match.
                _ => {}
            }
        }
    }
}

/// One buffer of a state as a saved file holds it: what it is and how many floats.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArrayInfo {
    /// Layer index.
    pub layer: usize,
    /// Which buffer of the layer's state.
    pub what: ArrayKind,
    /// Floats held.
    pub len: usize,
}

/// Which buffer of a layer's state an array is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArrayKind {
    /// Buffer `n` of a recurrent state (a fixed size).
    Recurrent(usize),
    /// A row cache's rows `[pos, width]` (grows with the position).
    Rows,
}

impl SeqState {
    /// Every buffer in layer order, with what it is (for saving).
    pub fn arrays(&self) -> Vec<(ArrayInfo, &[f32])> {
        let mut out = Vec::new();
        for (layer, l) in self.layers.iter().enumerate() {
            let info = |what, len| ArrayInfo { layer, what, len };
            match l {
                LayerState::Recurrent(r) => {
                    for (i, b) in r.buffers.iter().enumerate() {
                        out.push((info(ArrayKind::Recurrent(i), b.len()), b.as_slice()));
                    }
                }
                LayerState::Rows(c) => {
                    let r = c.rows();
                    out.push((info(ArrayKind::Rows, r.len()), r));
                }
            }
        }
        out
    }

    /// Bytes this state's buffers hold, counting a buffer `seen` already holds once (snapshots
    /// share buffers copy-on-write); adds this state's buffers to `seen`.
    pub fn unique_bytes(&self, seen: &mut std::collections::HashSet<usize>) -> u64 {
        let mut bytes = 0u64;
        for l in &self.layers {
            match l {
                LayerState::Recurrent(r) => {
                    for b in &r.buffers {
                        if seen.insert(Arc::as_ptr(b) as usize) {
                            bytes += 4 * b.capacity() as u64;
                        }
                    }
                }
                LayerState::Rows(c) => {
                    if seen.insert(c.buffer_id()) {
                        bytes += c.capacity_bytes() as u64;
                    }
                }
            }
        }
        bytes
    }

    /// A state at position `pos` with `arrays` (in `arrays()`'s order) on this state's layout
    /// (a fresh state of the same model: its recurrent buffers give the sizes, its row caches
    /// the width and the context limit). `None` when the arrays do not fit the layout.
    pub fn with_arrays(&self, pos: usize, arrays: Vec<Vec<f32>>) -> Option<SeqState> {
        let mut it = arrays.into_iter();
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                LayerState::Recurrent(r) => {
                    let mut buffers = Vec::with_capacity(r.buffers.len());
                    for b in &r.buffers {
                        let a = it.next()?;
                        if a.len() != b.len() {
                            return None;
                        }
                        buffers.push(Arc::new(a));
                    }
                    LayerState::Recurrent(Recurrent { buffers })
                }
                LayerState::Rows(c) => {
                    let rows = it.next()?;
                    if rows.len() != pos * c.width().max(1) {
                        return None;
                    }
                    let mut cache = c.clone();
                    cache.truncate(0);
                    cache.append(&rows);
                    LayerState::Rows(cache)
                }
            });
        }
        it.next().is_none().then_some(SeqState { pos, layers })
    }
}
