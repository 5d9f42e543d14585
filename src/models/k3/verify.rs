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
//! Owns KDA's undo record (`KdaUndo`, the runtime's `RecurrentUndo` for a KDA layer; the
//! `Rollback` around it is the runtime's); must not touch weights, the spine or the experts.

use std::sync::Arc;

use super::kda::{CONV, S};
use super::kda_kernels::{recurrent, replay, KdaDims, KdaInputs};
use crate::runtime::rollback::RecurrentUndo;
use crate::runtime::state::Recurrent;

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
}

impl RecurrentUndo for KdaUndo {
    fn keep(&self, st: &mut Recurrent, keep: usize) {
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
                Arc::make_mut(&mut st.buffers[S]).as_mut_slice(),
                KdaDims { t: n, h, d },
            );
        }
        // The window after `keep` rows: the last W−1 rows of [history, raw rows 0..keep].
        let p = h * d;
        let hl = (self.width - 1) * p;
        let conv = Arc::make_mut(&mut st.buffers[CONV]);
        for (which, raw) in self.raw.iter().enumerate() {
            let mut src = self.hist[which * hl..(which + 1) * hl].to_vec();
            src.extend_from_slice(&raw[..keep * p]);
            conv[which * hl..(which + 1) * hl].copy_from_slice(&src[src.len() - hl..]);
        }
    }

    fn bytes(&self) -> usize {
        let raw: usize = self.raw.iter().map(Vec::len).sum();
        4 * (self.hist.len() + raw + self.k.len() + self.v.len() + self.g.len() + self.beta.len())
    }
}

/// How many layers of a model are KDA layers.
pub fn kda_layers(cfg: &crate::models::k3::config::K3Config) -> usize {
    cfg.schedule
        .iter()
        .filter(|k| k.attn == crate::models::k3::config::AttnKind::Kda)
        .count()
}

/// The KDA layers of a model and their `(P, H, W)`: projected width, heads, conv width.
fn kda_shape(cfg: &crate::models::k3::config::K3Config) -> (usize, usize, usize, usize) {
    let la = &cfg.text().linear_attn_config;
    let p = la.num_heads * la.head_dim;
    (kda_layers(cfg), p, la.num_heads, la.short_conv_kernel_size)
}

/// Bytes a verify pass records per row at a model's shape (KDA layers only; MLA appends its
/// latent rows to the cache as any step does): `(6·P + H)·4` per KDA layer.
pub fn bytes_per_row(cfg: &crate::models::k3::config::K3Config) -> usize {
    let (kda, p, h, _) = kda_shape(cfg);
    kda * 4 * (6 * p + h)
}

/// Bytes a verify pass records once, whatever its rows: the conv windows from before the pass,
/// `3·(W−1)·P·4` per KDA layer.
pub fn fixed_bytes(cfg: &crate::models::k3::config::K3Config) -> usize {
    let (kda, p, _, w) = kda_shape(cfg);
    kda * 4 * 3 * w.saturating_sub(1) * p
}
