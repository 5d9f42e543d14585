//! AVX-512 twin of the dense row kernel: the same 16 lanes (`acc[j] += w·x`, a multiply then an
//! add, never fused), the same tail and the same tree, so results equal the portable kernel bit
//! for bit. Each 16-column chunk of weights is widened once for all input rows; several rows of
//! weights and of input at once (`dot_block`, a batched pass) keep 16 lane chains in flight.

use std::arch::x86_64::*;

use super::dense::{tree, DenseData, DenseMatrix, LANES};

#[inline(always)]
unsafe fn widen(data: &DenseData, r: usize, cols: usize, c: usize) -> __m512 {
    match *data {
        DenseData::F32(b) => _mm512_loadu_ps(b.as_ptr().add(4 * (r * cols + c)) as *const f32),
        DenseData::Bf16(b) => {
            let h = _mm256_loadu_si256(b.as_ptr().add(2 * (r * cols + c)) as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
        DenseData::I8 { q, .. } => {
            let v = _mm_loadu_si128(q.as_ptr().add(r * cols + c) as *const __m128i);
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
        }
    }
}

/// The first weight byte and the bytes per weight (for prefetch addresses).
#[inline(always)]
fn base_of(data: &DenseData) -> (*const u8, usize) {
    match *data {
        DenseData::F32(b) => (b.as_ptr(), 4),
        DenseData::Bf16(b) => (b.as_ptr(), 2),
        DenseData::I8 { q, .. } => (q.as_ptr(), 1),
    }
}

/// `out[t] = W[r] · xs[t]` for every input row.
///
/// # Safety
/// The CPU must support AVX-512F; `xs` rows have `m.cols` values and `out` one per row.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_row_multi(m: &DenseMatrix, r: usize, xs: &[&[f32]], out: &mut [f32]) {
    const T: usize = 4;
    let cols = m.cols;
    let full = cols - cols % LANES;
    let mut t0 = 0;
    while t0 < xs.len() {
        let nt = (xs.len() - t0).min(T);
        let mut acc = [_mm512_setzero_ps(); T];
        let mut c = 0;
        while c < full {
            let w = widen(&m.data, r, cols, c);
            for t in 0..nt {
                let x = _mm512_loadu_ps(xs[t0 + t].as_ptr().add(c));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(w, x));
            }
            c += LANES;
        }
        for t in 0..nt {
            let mut a = [0f32; LANES];
            _mm512_storeu_ps(a.as_mut_ptr(), acc[t]);
            for (j, aj) in a.iter_mut().enumerate().take(cols - full) {
                *aj += m.get_raw(r, full + j) * xs[t0 + t][full + j];
            }
            out[t0 + t] = match m.data {
                DenseData::I8 { .. } => tree(&a) * m.row_scale(r),
                _ => tree(&a),
            };
        }
        t0 += nt;
    }
}

/// `out[k] = W[r0 + k] · x` for `R` consecutive rows and one input row: `R` independent lane
/// chains in flight instead of one (a single chain waits on the add latency). Each row keeps its
/// own order, so results equal `dot_row_multi` bit for bit.
///
/// # Safety
/// The CPU must support AVX-512F; `x` has `m.cols` values and rows `r0..r0+R` exist.
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // lane chains indexed by row
pub unsafe fn dot_rows<const R: usize>(m: &DenseMatrix, r0: usize, x: &[f32], out: &mut [f32]) {
    let cols = m.cols;
    let full = cols - cols % LANES;
    // Prefetch the next block of R rows (contiguous) at the pace this block is consumed, so one
    // sequential stream runs ahead of the R interleaved row streams (as in the MXFP4 kernel).
    let (base, esize) = base_of(&m.data);
    let next = base.wrapping_add((r0 + R) * cols * esize);
    let step = R * LANES * esize; // bytes of the block consumed per chunk of columns
    let mut acc = [_mm512_setzero_ps(); R];
    let mut c = 0;
    while c < full {
        let at = next.wrapping_add(c / LANES * step);
        for l in 0..step.div_ceil(64) {
            // SAFETY: a prefetch never faults, whatever the address.
            _mm_prefetch(at.wrapping_add(64 * l) as *const i8, _MM_HINT_T1);
        }
        let xv = _mm512_loadu_ps(x.as_ptr().add(c));
        for k in 0..R {
            let w = widen(&m.data, r0 + k, cols, c);
            acc[k] = _mm512_add_ps(acc[k], _mm512_mul_ps(w, xv));
        }
        c += LANES;
    }
    for k in 0..R {
        let r = r0 + k;
        let mut a = [0f32; LANES];
        _mm512_storeu_ps(a.as_mut_ptr(), acc[k]);
        for (j, aj) in a.iter_mut().enumerate().take(cols - full) {
            *aj += m.get_raw(r, full + j) * x[full + j];
        }
        out[k] = match m.data {
            DenseData::I8 { .. } => tree(&a) * m.row_scale(r),
            _ => tree(&a),
        };
    }
}

/// `out[t * R + k] = W[r0 + k] · xs[t]` for `R` consecutive rows and `T` input rows: each
/// 16-column chunk of the `R` rows is widened once and used for all `T` inputs, with `R · T`
/// lane chains in flight (a batched pass: one chain per input row, as `dot_row_multi` runs,
/// waits on the add latency). Each (row, input) pair keeps its own order, so results equal
/// `dot_row_multi` bit for bit.
///
/// # Safety
/// The CPU must support AVX-512F; `xs` holds `T` rows of `m.cols` values, rows `r0..r0+R`
/// exist and `out` has `R · T` values.
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)] // lane chains indexed by row and input
pub unsafe fn dot_block<const R: usize, const T: usize>(
    m: &DenseMatrix,
    r0: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let cols = m.cols;
    let full = cols - cols % LANES;
    let (base, esize) = base_of(&m.data);
    let next = base.wrapping_add((r0 + R) * cols * esize);
    let step = R * LANES * esize;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut c = 0;
    while c < full {
        let at = next.wrapping_add(c / LANES * step);
        for l in 0..step.div_ceil(64) {
            // SAFETY: a prefetch never faults, whatever the address.
            _mm_prefetch(at.wrapping_add(64 * l) as *const i8, _MM_HINT_T1);
        }
        let mut w = [_mm512_setzero_ps(); R];
        for k in 0..R {
            w[k] = widen(&m.data, r0 + k, cols, c);
        }
        for t in 0..T {
            let xv = _mm512_loadu_ps(xs[t].as_ptr().add(c));
            for k in 0..R {
                acc[k][t] = _mm512_add_ps(acc[k][t], _mm512_mul_ps(w[k], xv));
            }
        }
        c += LANES;
    }
    for k in 0..R {
        let r = r0 + k;
        for t in 0..T {
            let mut a = [0f32; LANES];
            _mm512_storeu_ps(a.as_mut_ptr(), acc[k][t]);
            for (j, aj) in a.iter_mut().enumerate().take(cols - full) {
                *aj += m.get_raw(r, full + j) * xs[t][full + j];
            }
            out[t * R + k] = match m.data {
                DenseData::I8 { .. } => tree(&a) * m.row_scale(r),
                _ => tree(&a),
            };
        }
    }
}
