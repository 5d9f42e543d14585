//! `DenseKernel::Fast` on x86-64 with AVX-512F: the exact kernel's 16 lanes and final tree
//! (`dense.rs`), but each lane step one fused multiply-add (`acc = fma(w, x, acc)`) where the
//! exact arithmetic rounds the product first (to stay bit-identical to its scalar reference):
//! one rounding per step instead of two, and half the instructions. Blocks of 8 rows × 1–2
//! inputs or 4 rows × 3–6 inputs (up to 24 accumulators), the weights widened in registers as
//! they stream in, the columns in passes of `COL_CHUNK` so the inputs' slice stays in L1 for
//! every row block of a tile (accumulators wait in memory between passes; lanes keep their
//! order). Measured and dropped: `vdpbf16ps` (on this Xeon it issues at half the FMA rate and
//! rounds the inputs to bf16) and a widened f32 copy of each tile (slower at every batch size).
//!
//! A column past the last is a zero in both the weights and the input, so every (row, input)
//! pair runs the same steps into its own accumulators whatever the block, the batch or the
//! thread: single-row and batched calls agree bit for bit, and equal
//! `DenseMatrix::fused_dot_row`. Owns no weights, no tiling across threads and no choice of
//! kernel (`dense_gemm` drives it).

use std::arch::x86_64::*;

use super::dense::{tree, DenseData, DenseMatrix, LANES};

/// Whether this CPU runs the kernel (AVX-512F with BW and VL for the masked narrow loads; the
/// FMA and AVX2 features its code is compiled with).
pub fn runs_here() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
    })
}

/// The input rows zero-padded to whole lanes plus one cache line: rows a multiple of 4 KB
/// apart would all fall in the same L1 sets.
pub(super) fn pack_inputs(xs: &[f32], cols: usize, t: usize) -> (Vec<f32>, usize) {
    let stride = cols.next_multiple_of(LANES) + LANES;
    // From `t`, not `xs.len() / cols`: rows of no columns still take a (zero) packed row.
    let mut out = vec![0f32; t * stride];
    for (d, s) in out
        .chunks_exact_mut(stride)
        .zip(xs.chunks_exact(cols.max(1)))
    {
        d[..cols].copy_from_slice(s);
    }
    (out, stride)
}

// The storage kinds `direct` (and `dense_xtw`) are compiled for, one copy each, so the widening
// is chosen once per block rather than per chunk.
/// Storage kind: bf16.
pub(super) const BF16: u8 = 0;
/// Storage kind: f32.
pub(super) const F32: u8 = 1;
/// Storage kind: row-int8 (the row scale is applied by the caller).
pub(super) const I8: u8 = 2;

/// Inputs in flight at most (a block's accumulators: up to 8 rows × 2 or 4 × 6).
const INPUTS: usize = 6;
/// Columns per pass over a tile's rows: the inputs' slice of them (6 × 2 KB) stays in L1
/// while every row block of the tile runs over it.
const COL_CHUNK: usize = 512;

/// The 16 stored values from element `at` of storage kind `K` at `base` as f32, the lanes
/// outside `mask` zero.
///
/// # Safety
/// AVX-512F/BW/VL present; the elements `mask` selects exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn widen16<const K: u8>(base: *const u8, at: usize, mask: __mmask16) -> __m512 {
    match K {
        BF16 => {
            let h = _mm256_maskz_loadu_epi16(mask, base.add(2 * at) as *const i16);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
        F32 => _mm512_maskz_loadu_ps(mask, base.add(4 * at) as *const f32),
        _ => {
            debug_assert_eq!(K, I8);
            let v = _mm_maskz_loadu_epi8(mask, base.add(at) as *const i8);
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
        }
    }
}

/// One chunk of 16 columns from `c`: `R` rows' weights (`mask` lanes) against `T` inputs.
///
/// # Safety
/// As `direct`; the chunk's selected columns exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // accumulators indexed by row and input
unsafe fn chunk<const K: u8, const R: usize, const T: usize>(
    (base, row0, cols): (*const u8, usize, usize),
    (xp, xstride): (&[f32], usize),
    (c, mask): (usize, __mmask16),
    acc: &mut [[__m512; T]; R],
) {
    let mut w = [_mm512_setzero_ps(); R];
    for j in 0..R {
        w[j] = widen16::<K>(base, (row0 + j) * cols + c, mask);
    }
    for i in 0..T {
        let xv = _mm512_loadu_ps(xp.as_ptr().add(i * xstride + c));
        for j in 0..R {
            acc[j][i] = _mm512_fmadd_ps(w[j], xv, acc[j][i]);
        }
    }
}

/// `R` rows from `row` against `T` inputs over columns `c0..c1` (`c0` a whole chunk, `c1`
/// the row's end or a whole chunk), chunk by chunk in column order, the partial chunk masked:
/// accumulates into `accs[j·INPUTS + i]`.
///
/// # Safety
/// As `tile_rows`; rows `row..row+R` exist, `m.data` is of kind `K`, `xp` holds `T` packed
/// rows and `accs` `R·INPUTS` values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // accumulators indexed by row and input
unsafe fn direct<const K: u8, const R: usize, const T: usize>(
    m: &DenseMatrix,
    row: usize,
    x: (&[f32], usize),
    (c0, c1): (usize, usize),
    accs: &mut [__m512],
) {
    let base = match m.data {
        DenseData::Bf16(b) | DenseData::F32(b) | DenseData::I8 { q: b, .. } => b.as_ptr(),
    };
    let at = (base, row, m.cols);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for j in 0..R {
        for i in 0..T {
            acc[j][i] = accs[j * INPUTS + i];
        }
    }
    let whole = c0 + (c1 - c0) / LANES * LANES;
    for c in (c0..whole).step_by(LANES) {
        chunk::<K, R, T>(at, x, (c, u16::MAX), &mut acc);
    }
    if whole < c1 {
        chunk::<K, R, T>(at, x, (whole, (1u16 << (c1 - whole)) - 1), &mut acc);
    }
    for j in 0..R {
        for i in 0..T {
            accs[j * INPUTS + i] = acc[j][i];
        }
    }
}

/// Rows `r0..r0+n` against every input, `out[t·n + k]`: up to 6 inputs at a time, and for
/// them blocks of 8 rows (1–2 inputs) or 4 (more), a lone row for what is left.
///
/// # Safety
/// AVX-512F/BW/VL present; rows `r0..r0+n` exist, `xp` holds `t` packed input rows, `out`
/// has `t·n` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
pub(super) unsafe fn tile_rows(
    m: &DenseMatrix,
    r0: usize,
    n: usize,
    x: (&[f32], usize),
    t: usize,
    out: &mut [f32],
) {
    match m.data {
        DenseData::Bf16(_) => tile_kind::<BF16>(m, r0, n, x, t, out),
        DenseData::F32(_) => tile_kind::<F32>(m, r0, n, x, t, out),
        DenseData::I8 { .. } => tile_kind::<I8>(m, r0, n, x, t, out),
    }
}

/// `tile_rows` for storage kind `K`.
///
/// # Safety
/// As `tile_rows`; `m.data` is of kind `K`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn tile_kind<const K: u8>(
    m: &DenseMatrix,
    r0: usize,
    n: usize,
    (xp, xstride): (&[f32], usize),
    t: usize,
    out: &mut [f32],
) {
    let cols = m.cols;
    let mut accs = vec![_mm512_setzero_ps(); n * INPUTS];
    let mut t0 = 0;
    while t0 < t {
        let nt = (t - t0).min(INPUTS);
        let x = (&xp[t0 * xstride..], xstride);
        accs.fill(_mm512_setzero_ps());
        let mut c0 = 0;
        while c0 < cols {
            let cs = (c0, (c0 + COL_CHUNK).min(cols));
            let mut k = 0;
            while k < n {
                let big = if nt <= 2 { 8 } else { 4 };
                let rs = if n - k >= big { big } else { 1 };
                let (row, a) = (r0 + k, &mut accs[k * INPUTS..]);
                match (rs, nt) {
                    (8, 1) => direct::<K, 8, 1>(m, row, x, cs, a),
                    (8, _) => direct::<K, 8, 2>(m, row, x, cs, a),
                    (4, 3) => direct::<K, 4, 3>(m, row, x, cs, a),
                    (4, 4) => direct::<K, 4, 4>(m, row, x, cs, a),
                    (4, 5) => direct::<K, 4, 5>(m, row, x, cs, a),
                    (4, _) => direct::<K, 4, 6>(m, row, x, cs, a),
                    (_, 1) => direct::<K, 1, 1>(m, row, x, cs, a),
                    (_, 2) => direct::<K, 1, 2>(m, row, x, cs, a),
                    (_, 3) => direct::<K, 1, 3>(m, row, x, cs, a),
                    (_, 4) => direct::<K, 1, 4>(m, row, x, cs, a),
                    (_, 5) => direct::<K, 1, 5>(m, row, x, cs, a),
                    _ => direct::<K, 1, 6>(m, row, x, cs, a),
                }
                k += rs;
            }
            c0 = cs.1;
        }
        for k in 0..n {
            let scale = m.row_scale(r0 + k);
            for i in 0..nt {
                let mut a = [0f32; LANES];
                _mm512_storeu_ps(a.as_mut_ptr(), accs[k * INPUTS + i]);
                out[(t0 + i) * n + k] = tree(&a) * scale;
            }
        }
        t0 += nt;
    }
}
