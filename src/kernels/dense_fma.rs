//! `DenseKernel::Fast` on x86-64 with AVX-512F: the exact kernel's 16 lanes and final tree
//! (`dense.rs`), but each lane step one fused multiply-add (`acc = fma(w, x, acc)`) where the
//! exact arithmetic rounds the product first (to stay bit-identical to its scalar reference):
//! one rounding per step instead of two, and half the instructions. Blocks of 8 rows × 1–2
//! inputs or 4 rows × 3–6 inputs (up to 24 accumulators), the weights widened in registers as
//! they stream in. Measured and dropped: `vdpbf16ps` (on this Xeon it issues at half the FMA
//! rate and rounds the inputs to bf16) and a widened f32 copy of each tile (slower at every
//! batch size).
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

/// The 16 stored values from element `at` as f32, those from the `left`-th on zero (the row
/// ends there).
///
/// # Safety
/// AVX-512F/BW/VL present; elements `at..at + min(left, 16)` exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn widen16(data: &DenseData, at: usize, left: usize) -> __m512 {
    let mask: __mmask16 = if left >= LANES {
        u16::MAX
    } else {
        (1u16 << left) - 1
    };
    match *data {
        DenseData::Bf16(b) => {
            let h = _mm256_maskz_loadu_epi16(mask, b.as_ptr().add(2 * at) as *const i16);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
        DenseData::F32(b) => _mm512_maskz_loadu_ps(mask, b.as_ptr().add(4 * at) as *const f32),
        DenseData::I8 { q, .. } => {
            let v = _mm_maskz_loadu_epi8(mask, q.as_ptr().add(at) as *const i8);
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
        }
    }
}

/// `R` rows (`r0+k..`) against `T` inputs over the whole row, chunk by chunk in column order;
/// writes `out[i·n + k + j]`.
///
/// # Safety
/// As `tile_rows`; rows `r0+k..r0+k+R` exist and `xp` holds `T` packed rows.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
#[allow(clippy::needless_range_loop)] // accumulators indexed by row and input
unsafe fn direct<const R: usize, const T: usize>(
    m: &DenseMatrix,
    (r0, k, n): (usize, usize, usize),
    (xp, xstride): (&[f32], usize),
    out: &mut [f32],
) {
    let cols = m.cols;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for c in (0..cols).step_by(LANES) {
        let mut w = [_mm512_setzero_ps(); R];
        for j in 0..R {
            w[j] = widen16(&m.data, (r0 + k + j) * cols + c, cols - c);
        }
        for i in 0..T {
            let xv = _mm512_loadu_ps(xp.as_ptr().add(i * xstride + c));
            for j in 0..R {
                acc[j][i] = _mm512_fmadd_ps(w[j], xv, acc[j][i]);
            }
        }
    }
    for j in 0..R {
        let scale = m.row_scale(r0 + k + j);
        for i in 0..T {
            let mut a = [0f32; LANES];
            _mm512_storeu_ps(a.as_mut_ptr(), acc[j][i]);
            out[i * n + k + j] = tree(&a) * scale;
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
    (xp, xstride): (&[f32], usize),
    t: usize,
    out: &mut [f32],
) {
    let mut t0 = 0;
    while t0 < t {
        let nt = (t - t0).min(6);
        let x = (&xp[t0 * xstride..], xstride);
        let o = &mut out[t0 * n..];
        let mut k = 0;
        while k < n {
            let big = if nt <= 2 { 8 } else { 4 };
            let rs = if n - k >= big { big } else { 1 };
            let at = (r0, k, n);
            match (rs, nt) {
                (8, 1) => direct::<8, 1>(m, at, x, o),
                (8, _) => direct::<8, 2>(m, at, x, o),
                (4, 3) => direct::<4, 3>(m, at, x, o),
                (4, 4) => direct::<4, 4>(m, at, x, o),
                (4, 5) => direct::<4, 5>(m, at, x, o),
                (4, _) => direct::<4, 6>(m, at, x, o),
                (_, 1) => direct::<1, 1>(m, at, x, o),
                (_, 2) => direct::<1, 2>(m, at, x, o),
                (_, 3) => direct::<1, 3>(m, at, x, o),
                (_, 4) => direct::<1, 4>(m, at, x, o),
                (_, 5) => direct::<1, 5>(m, at, x, o),
                _ => direct::<1, 6>(m, at, x, o),
            }
            k += rs;
        }
        t0 += nt;
    }
}
