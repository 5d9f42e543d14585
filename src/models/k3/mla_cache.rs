//! MLA's per-sequence latent cache and the absorbed attention over it. The cache is the
//! runtime's `RowCache`, one row per position, `[c_n (kv_lora) | k_pe (rope)]`. Attention reads the rows in place for every head at once
//! (flash-decoding: positions split on a fixed grid across threads, a running max and sum per
//! query row, partial results folded in position order, so every row's bits are independent of
//! the other rows and of the context length), so memory per step is O(threads × heads ×
//! latent), never heads × context, and no copy of the cache is made per token.
//!
//! Owns the latent row layout and the attention arithmetic; must not touch weights or the spine.

use rayon::prelude::*;

/// Positions per block: a block of rows (`128 × 576 × 4` B) stays in L2 while every query row
/// passes over it.
const BLOCK: usize = 128;

/// Positions per split of a long context: a fixed grid, so a row's sum order never depends on
/// the context length or the thread count.
const SPAN: usize = 8 * BLOCK;

/// The latent cache of one MLA layer: the runtime's row cache, one `[c_n | k_pe]` row per
/// position.
use crate::runtime::row_cache::RowCache;

/// Running softmax state of one query row over some positions.
#[derive(Clone)]
struct Partial {
    max: Vec<f32>,
    sum: Vec<f32>,
    /// `[rows, out]`: Σ exp(s − max) · value.
    acc: Vec<f32>,
}

impl Partial {
    fn new(rows: usize, out: usize) -> Self {
        Partial {
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0.0; rows],
            acc: vec![0.0; rows * out],
        }
    }

    /// Folds `o`, which holds rows `r0..` of `self` over later positions, into `self`. A row
    /// `o` saw nothing of is left bit for bit as it was.
    fn merge_rows(&mut self, r0: usize, o: &Partial, out: usize) {
        for (i, r) in (r0..r0 + o.max.len()).enumerate() {
            if o.max[i] == f32::NEG_INFINITY {
                continue;
            }
            let m = self.max[r].max(o.max[i]);
            let (a, b) = ((self.max[r] - m).exp(), (o.max[i] - m).exp());
            self.sum[r] = self.sum[r] * a + o.sum[i] * b;
            let (x, y) = (
                &mut self.acc[r * out..(r + 1) * out],
                &o.acc[i * out..(i + 1) * out],
            );
            for (xi, yi) in x.iter_mut().zip(y) {
                *xi = *xi * a + yi * b;
            }
            self.max[r] = m;
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0] + s
}

#[inline(always)]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// One split's pass over positions `p0..p1`.
#[inline(always)]
fn span(q: &[f32], rows: &[f32], shape: Shape, p0: usize, p1: usize) -> Partial {
    let Shape {
        n_rows,
        width,
        out,
        visible,
        scale,
        ..
    } = shape;
    let mut part = Partial::new(n_rows, out);
    let mut s = vec![0f32; BLOCK];
    let mut b0 = p0;
    while b0 < p1 {
        let b1 = (b0 + BLOCK).min(p1);
        for r in 0..n_rows {
            let end = b1.min(visible(r));
            if end <= b0 {
                continue;
            }
            let qr = &q[r * width..(r + 1) * width];
            let mut bm = f32::NEG_INFINITY;
            for (j, p) in (b0..end).enumerate() {
                s[j] = dot(qr, &rows[p * width..(p + 1) * width]) * scale;
                bm = bm.max(s[j]);
            }
            let m = part.max[r].max(bm);
            let keep = (part.max[r] - m).exp();
            let acc = &mut part.acc[r * out..(r + 1) * out];
            if keep != 1.0 {
                acc.iter_mut().for_each(|a| *a *= keep);
            }
            let mut sum = part.sum[r] * keep;
            for (j, p) in (b0..end).enumerate() {
                let e = (s[j] - m).exp();
                sum += e;
                axpy(acc, e, &rows[p * width..p * width + out]);
            }
            part.sum[r] = sum;
            part.max[r] = m;
        }
        b0 = b1;
    }
    part
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn span_avx2(q: &[f32], rows: &[f32], shape: Shape, p0: usize, p1: usize) -> Partial {
    span(q, rows, shape, p0, p1)
}

fn span_best(q: &[f32], rows: &[f32], shape: Shape, p0: usize, p1: usize) -> Partial {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present; the body is plain Rust (same results as the baseline).
        return unsafe { span_avx2(q, rows, shape, p0, p1) };
    }
    span(q, rows, shape, p0, p1)
}

#[derive(Clone, Copy)]
struct Shape<'a> {
    n_rows: usize,
    width: usize,
    out: usize,
    visible: &'a (dyn Fn(usize) -> usize + Sync),
    scale: f32,
}

/// Absorbed attention of `q` (`[n_rows, width]`, each row `[q_lat | q_pe]`) over the cache:
/// `softmax(scale · q·rowᵀ)` over the positions row `r` may see (`visible(r)` of them), times
/// each row's first `out` floats (`c_n`). Returns `[n_rows, out]`.
pub fn attend(
    cache: &RowCache,
    q: &[f32],
    out: usize,
    scale: f32,
    visible: &(dyn Fn(usize) -> usize + Sync),
) -> Vec<f32> {
    let width = cache.width();
    let n_rows = q.len() / width.max(1);
    let shape = Shape {
        n_rows,
        width,
        out,
        visible,
        scale,
    };
    let total = cache.len();
    let threads = rayon::current_num_threads().max(1);
    let rows = cache.rows();
    // Positions are split on a fixed grid of `SPAN` (never on the context length or the thread
    // count) and each row's span partials are folded left in position order, so a row's result
    // depends only on its query and the positions it sees: a verify pass of several rows gives
    // every row the bits a single-row step gives it. A wave of spans runs at once (memory:
    // `threads` partials); rows are split too when there are fewer spans than threads.
    let spans: Vec<(usize, usize)> = (0..total)
        .step_by(SPAN)
        .map(|p0| (p0, (p0 + SPAN).min(total)))
        .collect();
    let mut acc = Partial::new(n_rows, out);
    for wave in spans.chunks(threads) {
        let row_parts = threads.div_ceil(wave.len()).min(n_rows.max(1));
        let per = n_rows.div_ceil(row_parts).max(1);
        let items: Vec<(usize, usize)> = (0..wave.len())
            .flat_map(|s| (0..n_rows).step_by(per).map(move |r0| (s, r0)))
            .collect();
        let parts: Vec<Partial> = items
            .par_iter()
            .map(|&(s, r0)| {
                let r1 = (r0 + per).min(n_rows);
                let vis = move |r: usize| visible(r0 + r);
                let sub = Shape {
                    n_rows: r1 - r0,
                    visible: &vis,
                    ..shape
                };
                let (p0, p1) = wave[s];
                span_best(&q[r0 * width..r1 * width], rows, sub, p0, p1)
            })
            .collect();
        // Folded in span order, row block by row block.
        for (&(_, r0), p) in items.iter().zip(&parts) {
            acc.merge_rows(r0, p, out);
        }
    }
    for r in 0..n_rows {
        let inv = if acc.sum[r] > 0.0 {
            1.0 / acc.sum[r]
        } else {
            0.0
        };
        acc.acc[r * out..(r + 1) * out]
            .iter_mut()
            .for_each(|a| *a *= inv);
    }
    acc.acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel against a plain two-pass softmax in f64, with a causal limit per row.
    #[test]
    fn attend_matches_plain_softmax() {
        check_attend(24, 16, 6, 777);
        // Short context, many rows (a prefill chunk): the row-split path.
        check_attend(24, 16, 40, 50);
        // Several spans, and a wave with fewer spans than threads.
        check_attend(24, 16, 5, 2 * SPAN + 300);
    }

    fn check_attend(width: usize, out: usize, n_rows: usize, total: usize) {
        let mut rng = crate::checkpoint::rng::Rng::new(9);
        let mut f = || rng.uniform() as f32 * 2.0 - 1.0;
        let mut cache = RowCache::new(width, total);
        let all: Vec<f32> = (0..total * width).map(|_| f()).collect();
        // Appended in uneven pieces: growth must not disturb earlier rows.
        for piece in all.chunks(width * 97) {
            cache.append(piece);
        }
        assert_eq!(cache.len(), total);
        let q: Vec<f32> = (0..n_rows * width).map(|_| f() * 3.0).collect();
        let visible = |r: usize| total - r % (total / 2);
        let got = attend(&cache, &q, out, 0.3, &visible);
        for r in 0..n_rows {
            let n = visible(r);
            let s: Vec<f64> = (0..n)
                .map(|p| {
                    (0..width)
                        .map(|k| q[r * width + k] as f64 * all[p * width + k] as f64)
                        .sum::<f64>()
                        * 0.3
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for o in 0..out {
                let want: f64 = (0..n)
                    .map(|p| (s[p] - m).exp() / z * all[p * width + o] as f64)
                    .sum();
                let g = got[r * out + o] as f64;
                assert!((g - want).abs() < 1e-5, "row {r} out {o}: {g} vs {want}");
            }
        }
    }

    /// Each row's result equals, bit for bit, that row attended alone over a cache holding only
    /// the positions it sees, whatever the thread count: what a verify pass relies on.
    #[test]
    fn rows_are_bit_identical_to_single_row_calls() {
        let (width, out, total) = (24, 16, 3 * SPAN + 77);
        let mut rng = crate::checkpoint::rng::Rng::new(5);
        let all: Vec<f32> = (0..total * width)
            .map(|_| rng.uniform() as f32 * 2.0 - 1.0)
            .collect();
        let q: Vec<f32> = (0..9 * width)
            .map(|_| rng.uniform() as f32 * 4.0 - 2.0)
            .collect();
        let mut cache = RowCache::new(width, total);
        cache.append(&all);
        // Nine rows, as a verify pass of nine positions at the end of the cache.
        let visible = |r: usize| total - 8 + r;
        for threads in [1usize, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let got = pool.install(|| attend(&cache, &q, out, 0.3, &visible));
            for r in 0..9 {
                let n = visible(r);
                let mut alone = RowCache::new(width, n);
                alone.append(&all[..n * width]);
                let one = attend(&alone, &q[r * width..(r + 1) * width], out, 0.3, &|_| n);
                assert_eq!(
                    &got[r * out..(r + 1) * out],
                    &one[..],
                    "row {r}, {threads} threads"
                );
            }
        }
    }

    #[test]
    fn growth_stops_at_the_limit_and_snapshots_are_untouched() {
        let mut c = RowCache::new(4, 10);
        c.append(&[1.0; 4 * 6]);
        let snap = c.clone();
        c.append(&[2.0; 4 * 4]);
        assert_eq!(c.len(), 10);
        assert_eq!(snap.len(), 6);
        assert!(snap.rows().iter().all(|&x| x == 1.0));
        assert_eq!(c.capacity_bytes(), 10 * 4 * 4);
    }
}
