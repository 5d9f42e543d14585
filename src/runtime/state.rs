//! `SeqState`: every per-sequence state of a model on the runtime. Buffers are shared
//! copy-on-write, so a snapshot is a cheap clone and restoring it continues bit-identically.
//! A layer holds K3's KDA or MLA state (their types are K3's) or a key/value row cache (any
//! other model's attention, e.g. gpt-oss). A `Mark` is the
//! lighter record a cancellable prefill keeps: MLA caches only grow, so their lengths suffice,
//! and only the KDA states are shared (at most one copy of them while the pass runs).

use super::row_cache::RowCache as LatentCache;
use crate::models::k3::kda::KdaState;
use crate::models::k3::mla::MlaState;

/// State of one layer's attention.
#[derive(Debug, Clone)]
pub enum LayerState {
    /// KDA conv histories and recurrent matrix.
    Kda(KdaState),
    /// MLA latent cache.
    Mla(MlaState),
    /// A key/value row cache (another model's attention, e.g. gpt-oss).
    Kv(KvState),
}

/// A key/value cache: one row per position (the model decides the row's layout).
#[derive(Debug, Clone)]
pub struct KvState {
    /// The rows.
    pub cache: LatentCache,
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
    /// A row cache's length (MLA or key/value).
    Rows(usize),
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
                    LayerState::Mla(m) => LayerMark::Rows(m.cache.len()),
                    LayerState::Kv(m) => LayerMark::Rows(m.cache.len()),
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
                (LayerState::Mla(s), LayerMark::Rows(len)) => s.cache.truncate(len),
                (LayerState::Kv(s), LayerMark::Rows(len)) => s.cache.truncate(len),
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
    /// `kda.conv`, `kda.s` or `mla.rows`.
    pub what: ArrayKind,
    /// Floats held.
    pub len: usize,
}

/// Which buffer of a layer's state an array is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ArrayKind {
    /// KDA's conv histories `[3, W−1, P]`.
    KdaConv,
    /// KDA's recurrent matrices `[H, K, V]`.
    KdaS,
    /// MLA's latent rows `[pos, width]`.
    MlaRows,
    /// A key/value cache's rows `[pos, width]`.
    KvRows,
}

impl SeqState {
    /// Every buffer in layer order, with what it is (for saving).
    pub fn arrays(&self) -> Vec<(ArrayInfo, &[f32])> {
        let mut out = Vec::new();
        for (layer, l) in self.layers.iter().enumerate() {
            let info = |what, len| ArrayInfo { layer, what, len };
            match l {
                LayerState::Kda(k) => {
                    out.push((info(ArrayKind::KdaConv, k.conv.len()), k.conv.as_slice()));
                    out.push((info(ArrayKind::KdaS, k.s.len()), k.s.as_slice()));
                }
                LayerState::Mla(m) => {
                    let r = m.cache.rows();
                    out.push((info(ArrayKind::MlaRows, r.len()), r));
                }
                LayerState::Kv(m) => {
                    let r = m.cache.rows();
                    out.push((info(ArrayKind::KvRows, r.len()), r));
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
                LayerState::Kda(k) => {
                    for b in [&k.conv, &k.s] {
                        if seen.insert(std::sync::Arc::as_ptr(b) as usize) {
                            bytes += 4 * b.capacity() as u64;
                        }
                    }
                }
                LayerState::Mla(MlaState { cache }) | LayerState::Kv(KvState { cache }) => {
                    if seen.insert(cache.buffer_id()) {
                        bytes += cache.capacity_bytes() as u64;
                    }
                }
            }
        }
        bytes
    }

    /// A state at position `pos` with `arrays` (in `arrays()`'s order) on this state's layout
    /// (a fresh state of the same model: its KDA buffers give the sizes, its MLA caches the
    /// width and the context limit). `None` when the arrays do not fit the layout.
    pub fn with_arrays(&self, pos: usize, arrays: Vec<Vec<f32>>) -> Option<SeqState> {
        let mut it = arrays.into_iter();
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(match l {
                LayerState::Kda(k) => {
                    let (conv, s) = (it.next()?, it.next()?);
                    if conv.len() != k.conv.len() || s.len() != k.s.len() {
                        return None;
                    }
                    LayerState::Kda(KdaState {
                        conv: std::sync::Arc::new(conv),
                        s: std::sync::Arc::new(s),
                    })
                }
                LayerState::Mla(MlaState { cache: c }) | LayerState::Kv(KvState { cache: c }) => {
                    let rows = it.next()?;
                    if rows.len() != pos * c.width().max(1) {
                        return None;
                    }
                    let mut cache = c.clone();
                    cache.truncate(0);
                    cache.append(&rows);
                    match l {
                        LayerState::Mla(_) => LayerState::Mla(MlaState { cache }),
                        _ => LayerState::Kv(KvState { cache }),
                    }
                }
            });
        }
        it.next().is_none().then_some(SeqState { pos, layers })
    }
}
