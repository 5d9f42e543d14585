//! The AVX-512 VNNI int8 kernel (`Kernel::Vnni512`): the arithmetic of `int8::rows_scalar`, one
//! pair of groups per register. A row's 32 packed bytes become 64 nibbles (low then high), a
//! byte shuffle turns them into doubled E2M1 values plus `WEIGHT_OFFSET` (unsigned, as
//! `vpdpbusd` wants), and one `vpdpbusd` starting from the input's `corr` gives each lane's exact
//! `Σ w·q`. Tiles of `ROWS` weight rows × `INPUTS` inputs reuse each decoded register for every
//! input. Must not change the lane or reduction order `int8.rs` defines.

use std::arch::x86_64::*;

use super::format::Mxfp4Matrix;
use super::int8::{reduce16, Q8Input, E2M1_X2, PAIR, WEIGHT_OFFSET};

/// Doubled E2M1 values plus `WEIGHT_OFFSET`, by nibble: the byte shuffle's table.
const LUT_U: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (E2M1_X2[i] as i32 + WEIGHT_OFFSET) as u8;
        i += 1;
    }
    t
};

/// Weight rows per tile.
const ROWS: usize = 3;

/// Inputs per tile (with `ROWS`: 12 accumulators, 3 decoded rows and their 3 scale registers).
const INPUTS: usize = 4;

/// Weight rows per tile when there is one input (decode).
const DECODE_ROWS: usize = 6;

/// `out[t][k] = W[r0 + k] · xs[t]` for `nrows` rows.
///
/// # Safety
/// The CPU must support AVX-512F, BW, VL and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
pub unsafe fn rows_vnni(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    let mut k = 0;
    if xs.len() == 1 {
        // Decode: more rows in flight, one input.
        while k + DECODE_ROWS <= nrows {
            let put: &mut dyn FnMut(usize, usize, f32) = &mut |_, i, v| out[0][k + i] = v;
            tile::<DECODE_ROWS, 1>(m, r0 + k, xs, put);
            k += DECODE_ROWS;
        }
    }
    while k < nrows {
        let r = if nrows - k >= ROWS { ROWS } else { 1 };
        let mut t0 = 0;
        while t0 < xs.len() {
            let rest = &xs[t0..];
            let put: &mut dyn FnMut(usize, usize, f32) = &mut |t, i, v| out[t0 + t][k + i] = v;
            t0 += match (r, rest.len()) {
                (ROWS, INPUTS..) => tile::<ROWS, INPUTS>(m, r0 + k, rest, put),
                (ROWS, 2..=3) => tile::<ROWS, 2>(m, r0 + k, rest, put),
                (ROWS, _) => tile::<ROWS, 1>(m, r0 + k, rest, put),
                (_, INPUTS..) => tile::<1, INPUTS>(m, r0 + k, rest, put),
                (_, 2..=3) => tile::<1, 2>(m, r0 + k, rest, put),
                _ => tile::<1, 1>(m, r0 + k, rest, put),
            };
        }
        k += r;
    }
}

/// The 16 group scales `e8m0(s)` from group `g0` (zero past the row's last group).
#[inline(always)]
unsafe fn scales16(s: *const u8, g0: usize, groups: usize) -> __m512 {
    let n = (groups - g0).min(16);
    let mask = if n == 16 { u16::MAX } else { (1u16 << n) - 1 };
    let b = _mm_maskz_loadu_epi8(mask, s.add(g0) as *const i8);
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu8_epi32(b), 23))
}

/// `R` weight rows from `r` against the first `T` inputs of `xs`; `put(t, i, y)` gets each
/// result. Returns `T`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const T: usize>(
    m: &Mxfp4Matrix,
    r: usize,
    xs: &[&Q8Input],
    put: &mut dyn FnMut(usize, usize, f32),
) -> usize {
    let groups = m.groups();
    let pairs = xs[0].pairs;
    let full = groups / 2;
    let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(LUT_U.as_ptr() as *const __m128i));
    let low4 = _mm512_set1_epi8(0x0F);
    // Lanes 0-3 and 8-11 take group 2p, lanes 4-7 and 12-15 group 2p + 1.
    let base = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1);
    let pk: [*const u8; R] = std::array::from_fn(|i| m.row_packed(r + i).as_ptr());
    let sc: [*const u8; R] = std::array::from_fn(|i| m.row_scales(r + i).as_ptr());
    let xq: [&Q8Input; T] = std::array::from_fn(|t| xs[t]);
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut sw16 = [_mm512_setzero_ps(); R];
    for p in 0..pairs {
        if p % 8 == 0 {
            for i in 0..R {
                sw16[i] = scales16(sc[i], 2 * p, groups);
            }
        }
        let idx = _mm512_add_epi32(base, _mm512_set1_epi32(2 * (p % 8) as i32));
        let mut w = [_mm512_setzero_si512(); R];
        let mut sw = [_mm512_setzero_ps(); R];
        for i in 0..R {
            if T == 1 && p % 2 == 0 {
                // Decode streams the rows once: fetch ahead (the hardware prefetcher loses
                // track of several interleaved row streams, as in the exact kernel).
                _mm_prefetch(pk[i].wrapping_add(32 * p + 512) as *const i8, _MM_HINT_T0);
            }
            let bytes = if p < full {
                _mm256_loadu_si256(pk[i].add(32 * p) as *const __m256i)
            } else {
                _mm256_zextsi128_si256(_mm_loadu_si128(pk[i].add(32 * p) as *const __m128i))
            };
            let both = _mm512_inserti64x4(
                _mm512_castsi256_si512(bytes),
                _mm256_srli_epi16(bytes, 4),
                1,
            );
            w[i] = _mm512_shuffle_epi8(lut, _mm512_and_si512(both, low4));
            sw[i] = _mm512_permutexvar_ps(idx, sw16[i]);
        }
        // Each input's three vectors are loaded once per pair and used by every row.
        for t in 0..T {
            let x = xq[t];
            let q = _mm512_loadu_si512(x.q.as_ptr().add(PAIR * p) as *const __m512i);
            let corr = _mm512_loadu_si512(x.corr.as_ptr().add(16 * p) as *const __m512i);
            let sa = _mm512_loadu_ps(x.sa.as_ptr().add(16 * p));
            for i in 0..R {
                let dot = _mm512_dpbusd_epi32(corr, w[i], q);
                acc[i][t] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sw[i], sa), acc[i][t]);
            }
        }
    }
    for (i, row) in acc.iter().enumerate() {
        for (t, a) in row.iter().enumerate() {
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
            put(t, i, reduce16(&lanes));
        }
    }
    T
}
