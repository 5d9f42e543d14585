//! The host GEMM's driver (`dense::gemm` checks the sizes and calls `run`): the rows in tiles
//! across the rayon pool (`run_tiles`, shared by every arithmetic), and on each tile the kernel
//! `DenseMatrix::kernel` picks. Exact: the SIMD twin's blocking (eight rows in flight for one
//! input, blocks of 4 rows × 4 inputs for several), the row kernel for what is left. Fast: the
//! fused kernel of the architecture (`dense_fma` on x86-64, `dense_neon`'s fused blocks on
//! aarch64) or, where the portable kernels were asked for, `DenseMatrix::fused_dot_row`. Every
//! path computes each (row, input) pair on its own, so the tiling never changes a result. Owns
//! no weights.

use rayon::prelude::*;

use super::dense::{DenseKernel, DenseMatrix};

/// Least work (weight bytes × rows of input) worth splitting across threads.
const PARALLEL_MIN_BYTES: usize = 256 << 10;
/// Weight rows per task.
const ROW_TILE: usize = 32;

/// `ys[t] = W xs[t]` for `t` input rows; sizes already checked.
pub(super) fn run(m: &DenseMatrix, xs: &[f32], t: usize, ys: &mut [f32]) {
    if m.kernel.effective() == DenseKernel::Fast {
        #[cfg(target_arch = "x86_64")]
        if super::dense::use_simd() {
            let (xp, stride) = super::dense_fma::pack_inputs(xs, m.cols, t);
            // SAFETY: `effective` found the kernel's features; `xp` holds t packed rows.
            run_tiles(m, t, ys, |r0, n, out| unsafe {
                super::dense_fma::tile_rows(m, r0, n, (&xp, stride), t, out)
            });
            return;
        }
        let xr = input_rows(xs, m.cols, t);
        #[cfg(target_arch = "aarch64")]
        if super::dense::use_simd() {
            run_tiles(m, t, ys, |r0, n, out| fused_neon(m, r0, n, &xr, out));
            return;
        }
        run_tiles(m, t, ys, |r0, n, out| {
            for k in 0..n {
                for (i, x) in xr.iter().enumerate() {
                    out[i * n + k] = m.fused_dot_row(r0 + k, x);
                }
            }
        });
        return;
    }
    let xr = input_rows(xs, m.cols, t);
    run_tiles(m, t, ys, |r0, n, out| {
        let done = match t {
            1 => rows_in_flight(m, r0, n, xr[0], out),
            _ => rows_batched(m, r0, n, &xr, out),
        };
        let mut one = vec![0f32; t];
        for k in done..n {
            m.dot_row_multi(r0 + k, &xr, &mut one);
            for (i, v) in one.iter().enumerate() {
                out[i * n + k] = *v;
            }
        }
    });
}

/// One (possibly empty) slice per input row, also when the rows have no columns.
fn input_rows(xs: &[f32], cols: usize, t: usize) -> Vec<&[f32]> {
    (0..t).map(|i| &xs[i * cols..(i + 1) * cols]).collect()
}

/// Calls `work(r0, n, out)` for each tile of `ROW_TILE` rows (`out` `[t][n]`), across the pool
/// when the matrix is worth it, and scatters the tiles into `ys` `[t][rows]`.
fn run_tiles(
    m: &DenseMatrix,
    t: usize,
    ys: &mut [f32],
    work: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let rows = m.rows;
    let tile = |i: usize| {
        let (r0, n) = (i * ROW_TILE, ROW_TILE.min(rows - i * ROW_TILE));
        let mut o = vec![0f32; t * n];
        work(r0, n, &mut o);
        o
    };
    let tiles = rows.div_ceil(ROW_TILE);
    let parts: Vec<Vec<f32>> = match m.bytes() * t >= PARALLEL_MIN_BYTES {
        true => (0..tiles).into_par_iter().map(tile).collect(),
        false => (0..tiles).map(tile).collect(),
    };
    for (i, o) in parts.iter().enumerate() {
        let (r0, n) = (i * ROW_TILE, ROW_TILE.min(rows - i * ROW_TILE));
        for tt in 0..t {
            ys[tt * rows + r0..tt * rows + r0 + n].copy_from_slice(&o[tt * n..(tt + 1) * n]);
        }
    }
}

/// The fused arithmetic on aarch64: rows four at a time against up to four inputs at a time
/// (`dense_neon::fused_block`), lone rows for what is left; `out[t·n + k]`.
#[cfg(target_arch = "aarch64")]
fn fused_neon(m: &DenseMatrix, r0: usize, n: usize, xs: &[&[f32]], out: &mut [f32]) {
    use super::dense_neon::fused_block;
    let mut block = [0f32; 16];
    let mut k = 0;
    while k < n {
        let rs = if n - k >= 4 { 4 } else { 1 };
        let mut t0 = 0;
        while t0 < xs.len() {
            let nt = (xs.len() - t0).min(4);
            let x = &xs[t0..t0 + nt];
            // SAFETY: NEON was detected; rows r0+k..r0+k+rs exist, every input row has m.cols
            // values and `block` holds rs·nt values.
            unsafe {
                match (rs, nt) {
                    (4, 4) => fused_block::<4, 4>(m, r0 + k, x, &mut block),
                    (4, 3) => fused_block::<4, 3>(m, r0 + k, x, &mut block),
                    (4, 2) => fused_block::<4, 2>(m, r0 + k, x, &mut block),
                    (4, _) => fused_block::<4, 1>(m, r0 + k, x, &mut block),
                    (_, 4) => fused_block::<1, 4>(m, r0 + k, x, &mut block),
                    (_, 3) => fused_block::<1, 3>(m, r0 + k, x, &mut block),
                    (_, 2) => fused_block::<1, 2>(m, r0 + k, x, &mut block),
                    _ => fused_block::<1, 1>(m, r0 + k, x, &mut block),
                }
            }
            for i in 0..nt {
                for j in 0..rs {
                    out[(t0 + i) * n + k + j] = block[i * rs + j];
                }
            }
            t0 += nt;
        }
        k += rs;
    }
}

/// Decode (one input row): rows `r0..r0+n` eight (then four) at a time with the SIMD kernel (a single
/// row's lane chain is add-latency bound); returns how many leading rows it computed (0 where
/// the kernel is unavailable).
fn rows_in_flight(m: &DenseMatrix, r0: usize, n: usize, x: &[f32], out: &mut [f32]) -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if super::dense::use_simd() {
        let mut k = 0;
        while k + 8 <= n {
            // SAFETY: the feature was detected; rows r0+k..r0+k+8 exist and x has m.cols values.
            unsafe { super::dense::simd::dot_rows::<8>(m, r0 + k, x, &mut out[k..k + 8]) };
            k += 8;
        }
        while k + 4 <= n {
            // SAFETY: the feature was detected; rows r0+k..r0+k+4 exist and x has m.cols values.
            unsafe { super::dense::simd::dot_rows::<4>(m, r0 + k, x, &mut out[k..k + 4]) };
            k += 4;
        }
        return k;
    }
    let _ = (m, r0, n, x, out);
    0
}

/// Several input rows (a batched pass, a prefill chunk): rows `r0..r0+n` four at a time against
/// up to four inputs at a time with the SIMD block kernel (16 lane chains in flight, each
/// chunk of weights widened once per four inputs); writes `out[t * n + k]` and returns how many
/// leading rows it computed (0 where the kernel is unavailable).
fn rows_batched(m: &DenseMatrix, r0: usize, n: usize, xs: &[&[f32]], out: &mut [f32]) -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if super::dense::use_simd() {
        use super::dense::simd::dot_block;
        const R: usize = 4;
        let t = xs.len();
        let mut block = [0f32; R * 4];
        let mut k = 0;
        while k + R <= n {
            let mut t0 = 0;
            while t0 < t {
                let nt = (t - t0).min(4);
                let x = &xs[t0..t0 + nt];
                // SAFETY: the feature was detected; rows r0+k..r0+k+R exist, every input row has
                // m.cols values (checked by `gemm`) and `block` holds R·nt values.
                unsafe {
                    match nt {
                        4 => dot_block::<R, 4>(m, r0 + k, x, &mut block),
                        3 => dot_block::<R, 3>(m, r0 + k, x, &mut block),
                        2 => dot_block::<R, 2>(m, r0 + k, x, &mut block),
                        _ => dot_block::<R, 1>(m, r0 + k, x, &mut block),
                    }
                }
                for tt in 0..nt {
                    out[(t0 + tt) * n + k..(t0 + tt) * n + k + R]
                        .copy_from_slice(&block[tt * R..(tt + 1) * R]);
                }
                t0 += nt;
            }
            k += R;
        }
        return k;
    }
    let _ = (m, r0, n, xs, out);
    0
}
