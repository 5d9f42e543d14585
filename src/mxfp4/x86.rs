#![allow(clippy::needless_range_loop)] // lane-indexed kernels read clearer with explicit indices
//! x86-64 kernels. Each keeps the 32 canonical lanes in its own physical order and receives the
//! input vectors already permuted to that order (`permute_x`); `lanes_to_canonical` maps back.

use std::arch::x86_64::*;

use super::format::{e8m0, scaled_tables, Mxfp4Matrix, E2M1, GROUP};
use super::kernels::{reduce32, Kernel};

/// Canonical lane held by physical lane `p` of a group, for each kernel's layout.
#[inline(always)]
pub fn canonical_lane(kernel: Kernel, p: usize) -> usize {
    match kernel {
        // [evens 0..30 | odds 1..31]
        // [lo nibbles | hi nibbles] of bytes 0..16 = [evens 0..30 | odds 1..31]
        Kernel::Avx512 => 2 * (p % 16) + p / 16,
        // four blocks of 8: lo nibbles of bytes 0..8, hi of 0..8, lo of 8..16, hi of 8..16
        Kernel::Avx2 => {
            let (q, i) = (p / 8, p % 8);
            16 * (q / 2) + 2 * i + (q % 2)
        }
        _ => p,
    }
}

/// Reorders x (length a multiple of 32) into the kernel's physical lane order.
pub fn permute_x(kernel: Kernel, x: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for g in 0..x.len() / GROUP {
        for p in 0..GROUP {
            out[g * GROUP + p] = x[g * GROUP + canonical_lane(kernel, p)];
        }
    }
    out
}

#[inline(always)]
fn finish(kernel: Kernel, phys: &[f32; 32]) -> f32 {
    let mut lanes = [0f32; 32];
    for (p, v) in phys.iter().enumerate() {
        lanes[canonical_lane(kernel, p)] = *v;
    }
    reduce32(&lanes)
}

/// AVX-512 kernel; `xs` are permuted with `permute_x(Kernel::Avx512, ..)`.
///
/// # Safety
/// The CPU must support AVX-512F.
#[target_feature(enable = "avx512f")]
pub unsafe fn rows_avx512(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&[f32]],
    out: &mut [&mut [f32]],
) {
    if xs.len() == 1 {
        // Decode: several rows in flight hide the FMA latency of each lane chain.
        let mut k = 0;
        while k + 4 <= nrows {
            avx512_rows1::<4>(m, r0 + k, xs[0], &mut out[0][k..k + 4]);
            k += 4;
        }
        while k < nrows {
            avx512_rows1::<1>(m, r0 + k, xs[0], &mut out[0][k..k + 1]);
            k += 1;
        }
        return;
    }
    let lut = _mm512_loadu_ps(E2M1.as_ptr());
    let mut k = 0;
    while k < nrows {
        k += if nrows - k >= ROWS_512 {
            avx512_block::<ROWS_512>(m, r0 + k, lut, xs, out, k)
        } else {
            avx512_block::<1>(m, r0 + k, lut, xs, out, k)
        };
    }
}

/// Weight rows decoded together in the several-input kernel: each input group loaded from L1
/// feeds `ROWS_512` rows. With one row at a time and 8 inputs, the inputs (8 × 11.5 KB at
/// gpt-oss's width) came from L2 for every row and bounded the FMAs at about half a port.
const ROWS_512: usize = 3;

/// Inputs per tile in the several-input kernel (with `ROWS_512` rows: 16 accumulators).
const INPUTS_512: usize = 4;

/// `R` weight rows from `r` against every input of `xs`, written to `out[t][k..k + R]`, in
/// tiles of constant width (a run-time width spilled every accumulator to the stack after each
/// FMA: 2.4x slower); returns `R`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_block<const R: usize>(
    m: &Mxfp4Matrix,
    r: usize,
    lut: __m512,
    xs: &[&[f32]],
    out: &mut [&mut [f32]],
    k: usize,
) -> usize {
    let rows: [(*const u8, &[u8]); R] =
        std::array::from_fn(|i| (m.row_packed(r + i).as_ptr(), m.row_scales(r + i)));
    let mut t0 = 0;
    while t0 < xs.len() {
        let rest = &xs[t0..];
        let acc: &mut dyn FnMut(usize, usize, f32) = &mut |t, i, v| out[t0 + t][k + i] = v;
        t0 += match rest.len() {
            INPUTS_512.. => avx512_tile::<R, INPUTS_512>(&rows, m.groups(), lut, rest, acc),
            2..=3 => avx512_tile::<R, 2>(&rows, m.groups(), lut, rest, acc),
            _ => avx512_tile::<R, 1>(&rows, m.groups(), lut, rest, acc),
        };
    }
    R
}

/// `R` weight rows (codes, scales) against the first `T` inputs of `xs`; `put(t, i, y)` gets
/// each result. Returns `T`.
#[inline(always)]
unsafe fn avx512_tile<const R: usize, const T: usize>(
    rows: &[(*const u8, &[u8]); R],
    groups: usize,
    lut: __m512,
    xs: &[&[f32]],
    put: &mut dyn FnMut(usize, usize, f32),
) -> usize {
    let xp: [*const f32; T] = std::array::from_fn(|t| xs[t].as_ptr());
    let mut acc = [[[_mm512_setzero_ps(); 2]; T]; R];
    for g in 0..groups {
        for i in 0..R {
            let (p, s) = rows[i];
            let tbl = _mm512_mul_ps(lut, _mm512_set1_ps(e8m0(*s.get_unchecked(g))));
            let v = avx512_bytes(p.add(16 * g));
            let we = _mm512_permutexvar_ps(v, tbl);
            let wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
            for t in 0..T {
                let x = xp[t].add(GROUP * g);
                acc[i][t][0] = _mm512_fmadd_ps(we, _mm512_loadu_ps(x), acc[i][t][0]);
                acc[i][t][1] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(x.add(16)), acc[i][t][1]);
            }
        }
    }
    for i in 0..R {
        for t in 0..T {
            put(t, i, finish512(acc[i][t][0], acc[i][t][1]));
        }
    }
    T
}

/// The 16 bytes of a group widened to one dword lane each.
#[inline(always)]
unsafe fn avx512_bytes(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i))
}

/// `R` consecutive rows against one input vector (several rows in flight hide the FMA latency
/// of each lane chain). Measured on Zen 4 (`bench mxfp4`, 1.1 GB): the group's scaled table as
/// one load (instead of a broadcast and a multiply) and a prefetch of the next block of `R`
/// rows (one cache line per group, so the one sequential stream runs ahead of the hardware
/// prefetcher, which lost track of the 2·R interleaved row streams) took one thread from 7.4
/// to 12.9 GB/s.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn avx512_rows1<const R: usize>(m: &Mxfp4Matrix, r0: usize, x: &[f32], out: &mut [f32]) {
    let tables = scaled_tables().0.as_ptr() as *const f32;
    let RowBlock {
        p,
        s,
        groups,
        pstride,
    } = RowBlock::new(m, r0);
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for g in 0..groups {
        RowBlock::prefetch_next::<R>(p, s, pstride, groups, g);
        let xp = x.as_ptr().add(GROUP * g);
        let x0 = _mm512_loadu_ps(xp);
        let x1 = _mm512_loadu_ps(xp.add(16));
        for r in 0..R {
            let tbl = _mm512_load_ps(tables.add(16 * *s.add(r * groups + g) as usize));
            let v = avx512_bytes(p.add(r * pstride + 16 * g));
            let we = _mm512_permutexvar_ps(v, tbl);
            let wo = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
            acc[r][0] = _mm512_fmadd_ps(we, x0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(wo, x1, acc[r][1]);
        }
    }
    for r in 0..R {
        out[r] = finish512(acc[r][0], acc[r][1]);
    }
}

/// `reduce32` of the AVX-512 layout (`even` = canonical lanes 0, 2, .., 30, `odd` = 1, 3, ..,
/// 31) in registers, in the same order: the spec's `a_k` is canonical lanes `4k..4k+4`. A
/// scalar scatter and reduce cost about an eighth of a 3,584-column row.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn finish512(even: __m512, odd: __m512) -> f32 {
    // Chunk m of X is a_{2m}, of Y is a_{2m+1} (canonical 8m+i and 8m+4+i; index bit 4 = odd).
    let x = _mm512_permutex2var_ps(
        even,
        _mm512_setr_epi32(0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29),
        odd,
    );
    let y = _mm512_permutex2var_ps(
        even,
        _mm512_setr_epi32(2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31),
        odd,
    );
    let p = _mm512_add_ps(x, y); // [a0+a1, a2+a3, a4+a5, a6+a7]
    let q = _mm512_add_ps(p, _mm512_shuffle_f32x4(p, p, 0b10_11_00_01)); // chunks 0, 2 hold pairs
    let s = _mm_add_ps(_mm512_castps512_ps128(q), _mm512_extractf32x4_ps(q, 2)); // s_i
    let t = _mm_add_ps(s, _mm_shuffle_ps(s, s, 0b10_11_00_01)); // lanes 0, 2: s0+s1, s2+s3
    _mm_cvtss_f32(_mm_add_ss(t, _mm_movehl_ps(t, t)))
}

/// Where a block of rows starting at `r0` lies: packed codes, scales, and their strides.
struct RowBlock {
    p: *const u8,
    s: *const u8,
    groups: usize,
    pstride: usize,
}

impl RowBlock {
    #[inline(always)]
    fn new(m: &Mxfp4Matrix, r0: usize) -> RowBlock {
        RowBlock {
            p: m.row_packed(r0).as_ptr(),
            s: m.row_scales(r0).as_ptr(),
            groups: m.groups(),
            pstride: m.cols / 2,
        }
    }

    /// At group `g` of a block of `R` rows, prefetches the next block's share: `R·16` bytes of
    /// packed codes per group (one line for 4 rows), and its scales every 16 groups.
    #[inline(always)]
    fn prefetch_next<const R: usize>(
        p: *const u8,
        s: *const u8,
        pstride: usize,
        groups: usize,
        g: usize,
    ) {
        let (pn, sn) = (p.wrapping_add(R * pstride), s.wrapping_add(R * groups));
        for l in 0..(R * 16).div_ceil(64) {
            prefetch(pn.wrapping_add(R * 16 * g + 64 * l));
        }
        if g.is_multiple_of(16) {
            prefetch(sn.wrapping_add(R * g));
        }
    }
}

/// A software prefetch into L1 (never faults, whatever the address).
#[inline(always)]
fn prefetch(p: *const u8) {
    // SAFETY: prefetch instructions do not access memory architecturally.
    unsafe { _mm_prefetch(p as *const i8, _MM_HINT_T0) }
}

/// AVX2 + FMA kernel; `xs` are permuted with `permute_x(Kernel::Avx2, ..)`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn rows_avx2(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&[f32]],
    out: &mut [&mut [f32]],
) {
    if xs.len() == 1 {
        // Decode: the AVX-512 kernel's scheme (scaled tables, 4 rows, next-block prefetch).
        let mut k = 0;
        while k + 4 <= nrows {
            avx2_rows1::<4>(m, r0 + k, xs[0], &mut out[0][k..k + 4]);
            k += 4;
        }
        while k < nrows {
            avx2_rows1::<1>(m, r0 + k, xs[0], &mut out[0][k..k + 1]);
            k += 1;
        }
        return;
    }
    for k in 0..nrows {
        let (p, s) = (m.row_packed(r0 + k).as_ptr(), m.row_scales(r0 + k));
        let mut t0 = 0;
        while t0 < xs.len() {
            // Constant widths keep the accumulators in registers (see `avx512_block`).
            let put = &mut |t: usize, v: f32| out[t0 + t][k] = v;
            t0 += if xs.len() - t0 >= INPUTS_AVX2 {
                avx2_tile::<INPUTS_AVX2>(p, s, &xs[t0..], put)
            } else {
                avx2_tile::<1>(p, s, &xs[t0..], put)
            };
        }
    }
}

/// Inputs per tile in the AVX2 several-input kernel: 4 accumulators each, plus the group's 4
/// decoded vectors, within the 16 registers.
const INPUTS_AVX2: usize = 2;

/// One weight row (codes `p`, scales `s`) against the first `T` inputs of `xs`; `put(t, y)`
/// gets each result. Returns `T`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_tile<const T: usize>(
    p: *const u8,
    s: &[u8],
    xs: &[&[f32]],
    put: &mut dyn FnMut(usize, f32),
) -> usize {
    let mag = _mm256_loadu_ps(E2M1.as_ptr());
    let sign = _mm256_set1_epi32(i32::MIN);
    let xp: [*const f32; T] = std::array::from_fn(|t| xs[t].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 4]; T];
    for (g, &sb) in s.iter().enumerate() {
        let tbl = _mm256_mul_ps(mag, _mm256_set1_ps(e8m0(sb)));
        let mut w = [_mm256_setzero_ps(); 4];
        for h in 0..2 {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(16 * g + 8 * h) as *const __m128i));
            let slo = _mm256_and_si256(_mm256_slli_epi32(v, 28), sign);
            let shi = _mm256_and_si256(_mm256_slli_epi32(v, 24), sign);
            let lo = _mm256_permutevar8x32_ps(tbl, v);
            let hi = _mm256_permutevar8x32_ps(tbl, _mm256_srli_epi32(v, 4));
            w[2 * h] = _mm256_xor_ps(lo, _mm256_castsi256_ps(slo));
            w[2 * h + 1] = _mm256_xor_ps(hi, _mm256_castsi256_ps(shi));
        }
        for t in 0..T {
            let x = xp[t].add(GROUP * g);
            for q in 0..4 {
                acc[t][q] = _mm256_fmadd_ps(w[q], _mm256_loadu_ps(x.add(8 * q)), acc[t][q]);
            }
        }
    }
    for t in 0..T {
        let mut phys = [0f32; 32];
        for q in 0..4 {
            _mm256_storeu_ps(phys.as_mut_ptr().add(8 * q), acc[t][q]);
        }
        put(t, finish(Kernel::Avx2, &phys));
    }
    T
}

/// The AVX2 twin of `avx512_rows1`: `R` rows against one input vector, each group's 8 scaled
/// magnitudes loaded from the scaled tables (the sign applied from bit 3 of each nibble, as in
/// `rows_avx2`), and the next block of rows prefetched.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_rows1<const R: usize>(m: &Mxfp4Matrix, r0: usize, x: &[f32], out: &mut [f32]) {
    let tables = scaled_tables().0.as_ptr() as *const f32;
    let sign = _mm256_set1_epi32(i32::MIN);
    let RowBlock {
        p,
        s,
        groups,
        pstride,
    } = RowBlock::new(m, r0);
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    for g in 0..groups {
        RowBlock::prefetch_next::<R>(p, s, pstride, groups, g);
        let xp = x.as_ptr().add(GROUP * g);
        let xv = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(xp.add(o)));
        for r in 0..R {
            let tbl = _mm256_loadu_ps(tables.add(16 * *s.add(r * groups + g) as usize));
            for h in 0..2 {
                let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                    p.add(r * pstride + 16 * g + 8 * h) as *const __m128i
                ));
                let slo = _mm256_and_si256(_mm256_slli_epi32(v, 28), sign);
                let shi = _mm256_and_si256(_mm256_slli_epi32(v, 24), sign);
                let lo = _mm256_permutevar8x32_ps(tbl, v);
                let hi = _mm256_permutevar8x32_ps(tbl, _mm256_srli_epi32(v, 4));
                let wl = _mm256_xor_ps(lo, _mm256_castsi256_ps(slo));
                let wh = _mm256_xor_ps(hi, _mm256_castsi256_ps(shi));
                acc[r][2 * h] = _mm256_fmadd_ps(wl, xv[2 * h], acc[r][2 * h]);
                acc[r][2 * h + 1] = _mm256_fmadd_ps(wh, xv[2 * h + 1], acc[r][2 * h + 1]);
            }
        }
    }
    for r in 0..R {
        let mut phys = [0f32; 32];
        for q in 0..4 {
            _mm256_storeu_ps(phys.as_mut_ptr().add(8 * q), acc[r][q]);
        }
        out[r] = finish(Kernel::Avx2, &phys);
    }
}
