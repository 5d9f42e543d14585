//! Grouped-query attention over one layer's key/value row cache, for any family whose state is
//! `LayerState::Rows`: grouped queries (each key/value head serves `heads / kv_heads` query
//! heads), a causal span that is the whole sequence (full layers) or the last `window`
//! positions, the current one included (sliding layers), and optionally a learned per-head sink
//! (gpt-oss): one extra logit in the softmax's denominator that takes probability but
//! contributes no value. fp32, with the max subtracted as the references do.
//! Owns the cache row layout (`[k (kv_heads·d) | v (kv_heads·d)]` per position, keys rotated)
//! and the per-sequence rotate-append-attend step of a pass; must not touch weights.

use rayon::prelude::*;

use super::rope::Rope;
use super::row_pass::PassSeq;
use crate::runtime::state::LayerState;
use crate::{Error, Result};

/// Shapes of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub d: usize,
    /// Positions a query sees (`usize::MAX` for a full layer).
    pub window: usize,
}

impl AttnShape {
    /// Floats per cache row.
    pub fn row_width(&self) -> usize {
        2 * self.kv_heads * self.d
    }
}

/// Attention of `t` queries `q` `[t, heads·d]` at positions `first..first + t` over `rows`
/// (`[first + t, row_width]`, the new rows already appended) → `[t, heads·d]`; `sinks`, one
/// logit per head, when the family has them.
pub fn attend(
    s: &AttnShape,
    q: &[f32],
    rows: &[f32],
    first: usize,
    sinks: Option<&[f32]>,
    scale: f32,
) -> Vec<f32> {
    let (hd, kvd) = (s.heads * s.d, s.kv_heads * s.d);
    let w = s.row_width();
    let group = s.heads / s.kv_heads;
    let t = q.len() / hd;
    let mut out = vec![0f32; t * hd];
    // One task per (query row, head): independent, so the result never depends on threads.
    out.par_chunks_mut(s.d).enumerate().for_each(|(job, o)| {
        let (r, h) = (job / s.heads, job % s.heads);
        let pos = first + r;
        let lo = (pos + 1).saturating_sub(s.window);
        let qh = &q[r * hd + h * s.d..][..s.d];
        let kv = h / group;
        let scores: Vec<f32> = (lo..=pos)
            .map(|j| {
                let k = &rows[j * w + kv * s.d..][..s.d];
                qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
            })
            .collect();
        let sink = sinks.map(|s| s[h]);
        let m = scores
            .iter()
            .fold(sink.unwrap_or(f32::NEG_INFINITY), |a, &b| a.max(b));
        let e: Vec<f32> = scores.iter().map(|x| (x - m).exp()).collect();
        let denom = e.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - m).exp());
        for (i, j) in (lo..=pos).enumerate() {
            let v = &rows[j * w + kvd + kv * s.d..][..s.d];
            let p = e[i] / denom;
            for (a, b) in o.iter_mut().zip(v) {
                *a += p * b;
            }
        }
    });
    out
}

/// One layer's attention step for every sequence of a pass: rotates each sequence's query rows
/// and new keys at its own positions, appends `[k | v]` rows to its cache, and attends over
/// it. `q` `[Σ T, heads·d]`, `k` and `v` `[Σ T, kv_heads·d]` are the pass's projections, rows in
/// the order of `seqs`; returns `[Σ T, heads·d]`.
#[allow(clippy::too_many_arguments)]
pub fn attend_seqs(
    l: usize,
    s: &AttnShape,
    rope: &Rope,
    q: &mut [f32],
    k: &[f32],
    v: &[f32],
    seqs: &mut [PassSeq<'_>],
    sinks: Option<&[f32]>,
    scale: f32,
) -> Result<Vec<f32>> {
    let (qd, kd) = (s.heads * s.d, s.kv_heads * s.d);
    let mut a = Vec::with_capacity(q.len());
    let mut r0 = 0;
    for seq in seqs.iter_mut() {
        let (first, n_rows) = (seq.state.pos, seq.ids.len());
        let LayerState::Rows(cache) = &mut seq.state.layers[l] else {
            return Err(Error::Msg(format!(
                "layer {l}: the state is not a key/value row state"
            )));
        };
        // q, k, v rows r0..r0+n_rows are this sequence's.
        let q = &mut q[r0 * qd..(r0 + n_rows) * qd];
        let mut rows = Vec::with_capacity(n_rows * s.row_width());
        for r in 0..n_rows {
            rope.apply(&mut q[r * qd..][..qd], first + r, s.d);
            let mut kr = k[(r0 + r) * kd..][..kd].to_vec();
            rope.apply(&mut kr, first + r, s.d);
            rows.extend_from_slice(&kr);
            rows.extend_from_slice(&v[(r0 + r) * kd..][..kd]);
        }
        cache.append(&rows);
        a.extend(attend(s, q, cache.rows(), first, sinks, scale));
        r0 += n_rows;
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A direct softmax over [scores…, sink] for one head, one query.
    fn naive(q: &[f32], ks: &[Vec<f32>], vs: &[Vec<f32>], sink: f32, scale: f32) -> Vec<f32> {
        let mut logits: Vec<f64> = ks
            .iter()
            .map(|k| q.iter().zip(k).map(|(a, b)| (a * b) as f64).sum::<f64>() * scale as f64)
            .collect();
        logits.push(sink as f64);
        let m = logits.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        let mut o = vec![0f64; q.len()];
        for (l, v) in logits.iter().zip(vs) {
            for (a, b) in o.iter_mut().zip(v) {
                *a += (l - m).exp() / z * *b as f64;
            }
        }
        o.into_iter().map(|x| x as f32).collect()
    }

    #[test]
    fn sliding_window_and_sinks_match_a_direct_softmax() {
        let s = AttnShape {
            heads: 4,
            kv_heads: 2,
            d: 8,
            window: 3,
        };
        let n = 6;
        let val = |i: usize| ((i * 7919 % 101) as f32 / 50.0) - 1.0;
        let rows: Vec<f32> = (0..n * s.row_width()).map(val).collect();
        let q: Vec<f32> = (0..2 * s.heads * s.d).map(|i| val(i + 5)).collect();
        let sinks = [0.5f32, -1.0, 2.0, 0.0];
        let got = attend(&s, &q, &rows, n - 2, Some(&sinks), 0.35);
        let plain = attend(&s, &q, &rows, n - 2, None, 0.35);
        for r in 0..2 {
            let pos = n - 2 + r;
            for h in 0..s.heads {
                let kv = h / 2;
                let span = pos + 1 - s.window..=pos;
                let ks: Vec<Vec<f32>> = span
                    .clone()
                    .map(|j| rows[j * 32 + kv * 8..][..8].to_vec())
                    .collect();
                let vs: Vec<Vec<f32>> = span
                    .map(|j| rows[j * 32 + 16 + kv * 8..][..8].to_vec())
                    .collect();
                let want = naive(&q[(r * 4 + h) * 8..][..8], &ks, &vs, sinks[h], 0.35);
                let g = &got[(r * 4 + h) * 8..][..8];
                for (a, b) in g.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "row {r} head {h}: {a} vs {b}");
                }
                // Without sinks: a plain causal softmax (a sink of -inf takes no probability).
                let g = &plain[(r * 4 + h) * 8..][..8];
                let want = naive(
                    &q[(r * 4 + h) * 8..][..8],
                    &ks,
                    &vs,
                    f32::NEG_INFINITY,
                    0.35,
                );
                for (a, b) in g.iter().zip(&want) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "no sinks, row {r} head {h}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
