//! Verify passes and their rollback, for lossless speculative decoding. A verify pass feeds the
//! last token and k drafts in one pass (one spine read, each selected expert read once per
//! layer) and returns the logits of every position, bit-identical to k+1 single steps: every
//! op of the pass computes a row the same way whatever the number of rows (dense kernels with a
//! fixed reduction order, the MLA attention on a fixed position grid, the KDA recurrence per
//! position). The caller then keeps the first `keep` positions; rollback reads nothing:
//!
//! - MLA: the latent cache is truncated.
//! - KDA: the pass applies only its first position to the state (the others run on a scratch
//!   copy, one layer at a time), and records per position the recurrence inputs (k, v, g, β)
//!   and the raw conv inputs; `keep` replays positions 1..keep onto the state with the same
//!   update function and rebuilds the conv window. Bytes per verified row at K3's shape:
//!   `(6·P + H)·4` per KDA layer (P = heads·head_dim), 19.4 MiB over 69 layers, instead of a
//!   453 MiB copy of the state.
//!
//! Owns the undo records; must not touch weights, the spine or the experts.

use std::sync::Arc;

use super::kda::KdaState;
use super::kda_kernels::{recurrent, replay, KdaDims, KdaInputs};
use super::state::{LayerState, SeqState};
use crate::Result;

/// What one KDA layer needs to return to the state after the first `keep` positions.
#[derive(Debug, Default)]
pub struct KdaUndo {
    pub(super) heads: usize,
    pub(super) d: usize,
    pub(super) width: usize,
    /// The conv history before the pass `[3, W−1, P]`.
    pub(super) hist: Vec<f32>,
    /// Raw projected q, k, v of every row `[T, P]` each.
    pub(super) raw: [Vec<f32>; 3],
    /// Recurrence inputs of rows 1.. `[T−1, H, D]` (the state already holds row 0).
    pub(super) k: Vec<f32>,
    pub(super) v: Vec<f32>,
    pub(super) g: Vec<f32>,
    /// `[T−1, H]`.
    pub(super) beta: Vec<f32>,
}

impl KdaUndo {
    /// The recurrence of a verify pass: row 0 onto `s`, the others on a scratch copy; returns
    /// the outputs of every row `[T, H, D]` and records rows 1.. for `keep`.
    pub(super) fn verify(&mut self, x: KdaInputs, s: &mut [f32], dims: KdaDims) -> Vec<f32> {
        let KdaDims { t, h, d } = dims;
        let row = h * d;
        let part = |a: usize, b: usize| KdaInputs {
            q: &x.q[a * row..b * row],
            k: &x.k[a * row..b * row],
            v: &x.v[a * row..b * row],
            g: &x.g[a * row..b * row],
            beta: &x.beta[a * h..b * h],
        };
        let mut o = recurrent(part(0, 1), s, KdaDims { t: 1, h, d });
        if t > 1 {
            let rest = part(1, t);
            let mut scratch = s.to_vec();
            o.extend(recurrent(rest, &mut scratch, KdaDims { t: t - 1, h, d }));
            self.k = rest.k.to_vec();
            self.v = rest.v.to_vec();
            self.g = rest.g.to_vec();
            self.beta = rest.beta.to_vec();
        }
        o
    }

    /// Returns `st` (holding row 0) to the state after rows `0..keep`.
    fn keep(&self, st: &mut KdaState, keep: usize) {
        let (h, d) = (self.heads, self.d);
        let n = keep.saturating_sub(1);
        if n > 0 {
            let row = h * d;
            let inp = KdaInputs {
                q: &[],
                k: &self.k[..n * row],
                v: &self.v[..n * row],
                g: &self.g[..n * row],
                beta: &self.beta[..n * h],
            };
            replay(
                inp,
                Arc::make_mut(&mut st.s).as_mut_slice(),
                KdaDims { t: n, h, d },
            );
        }
        // The window after `keep` rows: the last W−1 rows of [history, raw rows 0..keep].
        let p = h * d;
        let hl = (self.width - 1) * p;
        let conv = Arc::make_mut(&mut st.conv);
        for (which, raw) in self.raw.iter().enumerate() {
            let mut src = self.hist[which * hl..(which + 1) * hl].to_vec();
            src.extend_from_slice(&raw[..keep * p]);
            conv[which * hl..(which + 1) * hl].copy_from_slice(&src[src.len() - hl..]);
        }
    }

    /// Bytes held.
    fn bytes(&self) -> usize {
        let raw: usize = self.raw.iter().map(Vec::len).sum();
        4 * (self.hist.len() + raw + self.k.len() + self.v.len() + self.g.len() + self.beta.len())
    }
}

/// One layer's undo record.
#[derive(Debug)]
pub enum LayerUndo {
    /// A KDA layer.
    Kda(Box<KdaUndo>),
    /// An MLA layer (or another row cache): the cache length before the pass.
    Mla(usize),
}

/// What a verify pass recorded: enough to keep any prefix of its positions without reading
/// weights again.
#[derive(Debug)]
pub struct Rollback {
    /// Positions of the sequence before the pass.
    pub(super) pos: usize,
    /// Positions in the pass.
    pub(super) rows: usize,
    /// One record per layer.
    pub(super) layers: Vec<LayerUndo>,
}

impl Rollback {
    /// The record of a pass over a model whose layers hold only row caches (each layer's
    /// length before the pass): keeping a prefix truncates them.
    pub(crate) fn row_caches(pos: usize, rows: usize, lens: Vec<usize>) -> Rollback {
        Rollback {
            pos,
            rows,
            layers: lens.into_iter().map(LayerUndo::Mla).collect(),
        }
    }

    /// Positions the pass fed.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes the record holds (beyond the state itself).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerUndo::Kda(u) => u.bytes(),
                LayerUndo::Mla(_) => 0,
            })
            .sum()
    }

    /// Keeps the first `keep` positions of the pass in `state` (1 ≤ keep ≤ rows).
    pub fn keep(self, state: &mut SeqState, keep: usize) -> Result<()> {
        if keep == 0 || keep > self.rows || state.pos != self.pos + self.rows {
            return Err(crate::Error::Msg(format!(
                "cannot keep {keep} of a verify pass of {} rows at position {} (state at {})",
                self.rows, self.pos, state.pos
            )));
        }
        for (u, st) in self.layers.iter().zip(&mut state.layers) {
            match (u, st) {
                (LayerUndo::Kda(u), LayerState::Kda(s)) => u.keep(s, keep),
                (LayerUndo::Mla(len), LayerState::Mla(s)) => s.cache.truncate(len + keep),
                (LayerUndo::Mla(len), LayerState::Kv(s)) => s.cache.truncate(len + keep),
                _ => {
                    return Err(crate::Error::Msg(
                        "the verify record does not match the sequence state".into(),
                    ))
                }
            }
        }
        state.pos = self.pos + keep;
        Ok(())
    }
}

/// How many layers of a model are KDA layers.
pub fn kda_layers(cfg: &crate::config::K3Config) -> usize {
    cfg.schedule
        .iter()
        .filter(|k| k.attn == crate::config::AttnKind::Kda)
        .count()
}

/// The KDA layers of a model and their `(P, H, W)`: projected width, heads, conv width.
fn kda_shape(cfg: &crate::config::K3Config) -> (usize, usize, usize, usize) {
    let la = &cfg.text().linear_attn_config;
    let p = la.num_heads * la.head_dim;
    (kda_layers(cfg), p, la.num_heads, la.short_conv_kernel_size)
}

/// Bytes a verify pass records per row at a model's shape (KDA layers only; MLA appends its
/// latent rows to the cache as any step does): `(6·P + H)·4` per KDA layer.
pub fn bytes_per_row(cfg: &crate::config::K3Config) -> usize {
    let (kda, p, h, _) = kda_shape(cfg);
    kda * 4 * (6 * p + h)
}

/// Bytes a verify pass records once, whatever its rows: the conv windows from before the pass,
/// `3·(W−1)·P·4` per KDA layer.
pub fn fixed_bytes(cfg: &crate::config::K3Config) -> usize {
    let (kda, p, _, w) = kda_shape(cfg);
    kda * 4 * 3 * w.saturating_sub(1) * p
}
