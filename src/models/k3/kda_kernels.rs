//! The KDA gated delta rule on host slices: the per-position recurrence (the exactness
//! reference) and the chunked form of spec §3.4.
//!
//! Layouts: `q, k, v, g` are `[T, H, D]`, `beta` is `[T, H]`, the state `s` is `[H, K=D, V=D]`
//! with the decay acting on K. `q` is already L2-normalised and scaled, `k` L2-normalised, `g` is
//! the log decay in `(lower_bound, 0)`.

/// Shapes of a KDA call.
#[derive(Debug, Clone, Copy)]
pub struct KdaDims {
    /// Positions.
    pub t: usize,
    /// Heads.
    pub h: usize,
    /// Head width (K = V).
    pub d: usize,
}

/// Prepared inputs of one KDA call.
#[derive(Debug, Clone, Copy)]
pub struct KdaInputs<'a> {
    /// Queries (L2-normalised, scaled) `[T, H, D]`.
    pub q: &'a [f32],
    /// Keys (L2-normalised) `[T, H, D]`.
    pub k: &'a [f32],
    /// Values `[T, H, D]`.
    pub v: &'a [f32],
    /// Log decay `[T, H, D]`.
    pub g: &'a [f32],
    /// Write strengths `[T, H]`.
    pub beta: &'a [f32],
}

/// One head's state update at one position: `S ← S·diag(e^g)`, `S += β k (v − Sᵀk)ᵀ`. The
/// decode step, the verify pass and the rollback replay all call this one function, so they
/// agree bit for bit.
#[inline(always)]
fn update(sh: &mut [f32], kt: &[f32], vt: &[f32], gt: &[f32], b: f32, pred: &mut [f32]) {
    let d = kt.len();
    for kk in 0..d {
        let decay = gt[kk].exp();
        for x in &mut sh[kk * d..(kk + 1) * d] {
            *x *= decay;
        }
    }
    pred.iter_mut().for_each(|p| *p = 0.0);
    for kk in 0..d {
        let kv = kt[kk];
        let row = &sh[kk * d..(kk + 1) * d];
        for (p, x) in pred.iter_mut().zip(row) {
            *p += kv * x;
        }
    }
    for kk in 0..d {
        let bk = b * kt[kk];
        let row = &mut sh[kk * d..(kk + 1) * d];
        for ((x, vv), p) in row.iter_mut().zip(vt).zip(pred.iter()) {
            *x += bk * (vv - p);
        }
    }
}

/// Per-position recurrence: `S ← S·diag(e^g)`, `S += β k (v − Sᵀk)ᵀ`, `o = Sᵀq`.
pub fn recurrent(x: KdaInputs, s: &mut [f32], dims: KdaDims) -> Vec<f32> {
    let KdaInputs { q, k, v, g, beta } = x;
    let KdaDims { t: tn, h: hn, d } = dims;
    let mut o = vec![0f32; tn * hn * d];
    let mut pred = vec![0f32; d];
    for t in 0..tn {
        for h in 0..hn {
            let base = (t * hn + h) * d;
            let r = base..base + d;
            let sh = &mut s[h * d * d..(h + 1) * d * d];
            update(
                sh,
                &k[r.clone()],
                &v[r.clone()],
                &g[r.clone()],
                beta[t * hn + h],
                &mut pred,
            );
            let (qt, ot) = (&q[r.clone()], &mut o[r]);
            for kk in 0..d {
                let qv = qt[kk];
                let row = &sh[kk * d..(kk + 1) * d];
                for (oo, x) in ot.iter_mut().zip(row) {
                    *oo += qv * x;
                }
            }
        }
    }
    o
}

/// The state updates of `recurrent` without the outputs (`q` is ignored): replays accepted
/// positions of a verify pass onto the state from before it, bit for bit.
pub fn replay(x: KdaInputs, s: &mut [f32], dims: KdaDims) {
    let KdaInputs { k, v, g, beta, .. } = x;
    let KdaDims { t: tn, h: hn, d } = dims;
    let mut pred = vec![0f32; d];
    for t in 0..tn {
        for h in 0..hn {
            let r = (t * hn + h) * d..(t * hn + h + 1) * d;
            let sh = &mut s[h * d * d..(h + 1) * d * d];
            update(
                sh,
                &k[r.clone()],
                &v[r.clone()],
                &g[r],
                beta[t * hn + h],
                &mut pred,
            );
        }
    }
}

/// The chunked form (spec §3.4) with chunks of `chunk` positions; the same result as
/// `recurrent` up to rounding. Every exponential is of a difference `G_t − G_i ≤ 0`.
pub fn chunked(x: KdaInputs, s: &mut [f32], dims: KdaDims, chunk: usize) -> Vec<f32> {
    let KdaInputs { q, k, v, g, beta } = x;
    let KdaDims { t: tn, h: hn, d } = dims;
    let chunk = chunk.max(1);
    let mut o = vec![0f32; tn * hn * d];
    let idx = |t: usize, h: usize| (t * hn + h) * d;
    let mut t0 = 0;
    while t0 < tn {
        let c = chunk.min(tn - t0);
        for h in 0..hn {
            let sh = &mut s[h * d * d..(h + 1) * d * d];
            // Cumulative log decay within the chunk.
            let mut gc = vec![0f32; c * d];
            for i in 0..c {
                for kk in 0..d {
                    let prev = if i > 0 { gc[(i - 1) * d + kk] } else { 0.0 };
                    gc[i * d + kk] = prev + g[idx(t0 + i, h) + kk];
                }
            }
            // Forward substitution for Δ, and the outputs.
            let mut delta = vec![0f32; c * d];
            let mut tmp = vec![0f32; d];
            for t in 0..c {
                let kt = &k[idx(t0 + t, h)..idx(t0 + t, h) + d];
                let qt = &q[idx(t0 + t, h)..idx(t0 + t, h) + d];
                let vt = &v[idx(t0 + t, h)..idx(t0 + t, h) + d];
                let gt = &gc[t * d..(t + 1) * d];
                // tmp = v_t − K̄_t S0 − Σ_{i<t} L[t,i] Δ_i
                tmp.copy_from_slice(vt);
                for kk in 0..d {
                    let kb = kt[kk] * gt[kk].exp();
                    let row = &sh[kk * d..(kk + 1) * d];
                    for (x, r) in tmp.iter_mut().zip(row) {
                        *x -= kb * r;
                    }
                }
                for i in 0..t {
                    let ki = &k[idx(t0 + i, h)..idx(t0 + i, h) + d];
                    let gi = &gc[i * d..(i + 1) * d];
                    let mut l = 0f32;
                    for kk in 0..d {
                        l += kt[kk] * ki[kk] * (gt[kk] - gi[kk]).exp();
                    }
                    let di = &delta[i * d..(i + 1) * d];
                    for (x, dd) in tmp.iter_mut().zip(di) {
                        *x -= l * dd;
                    }
                }
                let b = beta[(t0 + t) * hn + h];
                for (dd, x) in delta[t * d..(t + 1) * d].iter_mut().zip(&tmp) {
                    *dd = b * x;
                }
                // O_t = Q̄_t S0 + Σ_{i≤t} P[t,i] Δ_i
                let ot = &mut o[idx(t0 + t, h)..idx(t0 + t, h) + d];
                for kk in 0..d {
                    let qb = qt[kk] * gt[kk].exp();
                    let row = &sh[kk * d..(kk + 1) * d];
                    for (x, r) in ot.iter_mut().zip(row) {
                        *x += qb * r;
                    }
                }
                for i in 0..=t {
                    let ki = &k[idx(t0 + i, h)..idx(t0 + i, h) + d];
                    let gi = &gc[i * d..(i + 1) * d];
                    let mut p = 0f32;
                    for kk in 0..d {
                        p += qt[kk] * ki[kk] * (gt[kk] - gi[kk]).exp();
                    }
                    let di = &delta[i * d..(i + 1) * d];
                    for (x, dd) in ot.iter_mut().zip(di) {
                        *x += p * dd;
                    }
                }
            }
            // S_C = diag(e^{G_C}) S0 + Σ_i (k_i ⊙ e^{G_C − G_i}) Δ_iᵀ
            let gl = &gc[(c - 1) * d..c * d];
            for kk in 0..d {
                let decay = gl[kk].exp();
                let row = &mut sh[kk * d..(kk + 1) * d];
                for x in row.iter_mut() {
                    *x *= decay;
                }
                for i in 0..c {
                    let w = k[idx(t0 + i, h) + kk] * (gl[kk] - gc[i * d + kk]).exp();
                    let di = &delta[i * d..(i + 1) * d];
                    for (x, dd) in row.iter_mut().zip(di) {
                        *x += w * dd;
                    }
                }
            }
        }
        t0 += c;
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::rng::Rng;

    fn unit(rng: &mut Rng, n: usize, d: usize) -> Vec<f32> {
        let mut v: Vec<f32> = (0..n * d).map(|_| rng.normal() as f32).collect();
        for c in v.chunks_mut(d) {
            let n = c.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            c.iter_mut().for_each(|x| *x /= n);
        }
        v
    }

    /// Chunked vs per-position loop: gates near −5 and near 0, several chunk sizes, T not a
    /// multiple of the chunk, nonzero initial state.
    #[test]
    fn chunked_matches_recurrence() {
        let mut rng = Rng::new(42);
        let (h, d) = (3, 16);
        for &(t, gate_lo, gate_hi) in &[
            (37usize, -5.0f32, -4.9f32),
            (37, -0.01, 0.0),
            (50, -5.0, 0.0),
            (1, -2.0, -1.0),
        ] {
            let q: Vec<f32> = unit(&mut rng, t * h, d)
                .iter()
                .map(|x| x / (d as f32).sqrt())
                .collect();
            let k = unit(&mut rng, t * h, d);
            let v: Vec<f32> = (0..t * h * d).map(|_| rng.normal() as f32).collect();
            let g: Vec<f32> = (0..t * h * d)
                .map(|_| gate_lo + (gate_hi - gate_lo) * rng.uniform() as f32)
                .collect();
            let beta: Vec<f32> = (0..t * h).map(|_| rng.uniform() as f32).collect();
            let s0: Vec<f32> = (0..h * d * d).map(|_| rng.normal() as f32 * 0.5).collect();
            let dims = KdaDims { t, h, d };
            let mut s_ref = s0.clone();
            let inp = KdaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            };
            let o_ref = recurrent(inp, &mut s_ref, dims);
            for chunk in [1usize, 4, 16, 64] {
                let mut s = s0.clone();
                let o = chunked(inp, &mut s, dims, chunk);
                let scale = o_ref.iter().fold(0f32, |a, x| a.max(x.abs())).max(1.0);
                let err = o
                    .iter()
                    .zip(&o_ref)
                    .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                assert!(
                    err <= 2e-5 * scale,
                    "t {t} gates ({gate_lo},{gate_hi}) chunk {chunk}: out err {err}"
                );
                let sscale = s_ref.iter().fold(0f32, |a, x| a.max(x.abs())).max(1.0);
                let serr = s
                    .iter()
                    .zip(&s_ref)
                    .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
                assert!(
                    serr <= 2e-5 * sscale,
                    "t {t} chunk {chunk}: state err {serr}"
                );
            }
        }
    }

    /// Split calls of the recurrence equal one call bit for bit (state carries exactly).
    #[test]
    fn recurrence_is_resumable() {
        let mut rng = Rng::new(1);
        let (t, h, d) = (9, 2, 8);
        let q = unit(&mut rng, t * h, d);
        let k = unit(&mut rng, t * h, d);
        let v: Vec<f32> = (0..t * h * d).map(|_| rng.normal() as f32).collect();
        let g: Vec<f32> = (0..t * h * d)
            .map(|_| -5.0 * rng.uniform() as f32)
            .collect();
        let beta: Vec<f32> = (0..t * h).map(|_| rng.uniform() as f32).collect();
        let mut s1 = vec![0f32; h * d * d];
        let all = recurrent(
            KdaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
            },
            &mut s1,
            KdaDims { t, h, d },
        );
        let mut s2 = vec![0f32; h * d * d];
        let mut parts = Vec::new();
        for tt in 0..t {
            let r = |x: &[f32]| x[tt * h * d..(tt + 1) * h * d].to_vec();
            let (qq, kk, vv, gg) = (r(&q), r(&k), r(&v), r(&g));
            let inp = KdaInputs {
                q: &qq,
                k: &kk,
                v: &vv,
                g: &gg,
                beta: &beta[tt * h..(tt + 1) * h],
            };
            parts.extend(recurrent(inp, &mut s2, KdaDims { t: 1, h, d }));
        }
        assert_eq!(all, parts);
        assert_eq!(s1, s2);
    }
}
