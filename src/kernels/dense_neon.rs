//! NEON twin of the dense row kernel (`dense_x86.rs`): the same 16 lanes as 4 registers of 4
//! (`acc[j] += w·x`, a multiply then an add, never fused), the same tail and the same tree, so
//! results equal the portable kernel bit for bit; and, with `fused_block`, the same lanes with
//! one fused multiply-add per step (`DenseKernel::Fast`, equal to `fused_dot_row`). Each
//! 16-column chunk of weights is widened once for all input rows of a block. Must not change the lane or reduction order `dense.rs`
//! defines.

use std::arch::aarch64::*;

use super::dense::{tree, DenseData, DenseMatrix, LANES};

/// The 16 weights of row `r` from column `c`, as f32 (lane `4q + i` in register `q`, lane `i`).
#[inline(always)]
unsafe fn widen(data: &DenseData, r: usize, cols: usize, c: usize) -> [float32x4_t; 4] {
    match *data {
        DenseData::F32(b) => {
            let p = b.as_ptr().add(4 * (r * cols + c)) as *const f32;
            [0, 4, 8, 12].map(|o| vld1q_f32(p.add(o)))
        }
        DenseData::Bf16(b) => {
            let p = b.as_ptr().add(2 * (r * cols + c)) as *const u16;
            let (h0, h1) = (vld1q_u16(p), vld1q_u16(p.add(8)));
            [
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h0))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h0)),
                vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h1))),
                vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h1)),
            ]
        }
        DenseData::I8 { q, .. } => {
            let v = vld1q_s8(q.as_ptr().add(r * cols + c) as *const i8);
            let (lo, hi) = (vmovl_s8(vget_low_s8(v)), vmovl_high_s8(v));
            [
                vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
                vcvtq_f32_s32(vmovl_high_s16(lo)),
                vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
                vcvtq_f32_s32(vmovl_high_s16(hi)),
            ]
        }
    }
}

/// `out[t * R + k] = W[r0 + k] · xs[t]` for `R` consecutive rows and `T` input rows, each
/// (row, input) pair in its own 16 lanes.
///
/// # Safety
/// The CPU must support NEON; `xs` holds `T` rows of `m.cols` values, rows `r0..r0+R` exist
/// and `out` has `R · T` values.
#[target_feature(enable = "neon")]
pub unsafe fn dot_block<const R: usize, const T: usize>(
    m: &DenseMatrix,
    r0: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    block::<R, T, false>(m, r0, xs, out)
}

/// `dot_block` in `DenseKernel::Fast`'s arithmetic (`DenseMatrix::fused_dot_row`): each lane
/// step one `vfmaq_f32`, a last partial chunk's missing columns `0·0 + acc`; the same bits as
/// the x86-64 fused kernel.
///
/// # Safety
/// As `dot_block`.
#[target_feature(enable = "neon")]
pub unsafe fn fused_block<const R: usize, const T: usize>(
    m: &DenseMatrix,
    r0: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    block::<R, T, true>(m, r0, xs, out)
}

/// `dot_block` (`FUSED` false) and `fused_block` (true).
///
/// # Safety
/// As `dot_block`.
#[inline]
#[target_feature(enable = "neon")]
#[allow(clippy::needless_range_loop)] // lane chains indexed by row and input
unsafe fn block<const R: usize, const T: usize, const FUSED: bool>(
    m: &DenseMatrix,
    r0: usize,
    xs: &[&[f32]],
    out: &mut [f32],
) {
    let cols = m.cols;
    let full = cols - cols % LANES;
    let mut acc = [[[vdupq_n_f32(0.0); 4]; T]; R];
    let mut c = 0;
    while c < full {
        let w: [[float32x4_t; 4]; R] = std::array::from_fn(|k| widen(&m.data, r0 + k, cols, c));
        for t in 0..T {
            let xp = xs[t].as_ptr().add(c);
            let xv = [0, 4, 8, 12].map(|o| vld1q_f32(xp.add(o)));
            for k in 0..R {
                for q in 0..4 {
                    acc[k][t][q] = match FUSED {
                        true => vfmaq_f32(acc[k][t][q], w[k][q], xv[q]),
                        false => vaddq_f32(acc[k][t][q], vmulq_f32(w[k][q], xv[q])),
                    };
                }
            }
        }
        c += LANES;
    }
    for k in 0..R {
        let r = r0 + k;
        for t in 0..T {
            let mut a = [0f32; LANES];
            for q in 0..4 {
                vst1q_f32(a.as_mut_ptr().add(4 * q), acc[k][t][q]);
            }
            if FUSED && cols > full {
                for (j, aj) in a.iter_mut().enumerate() {
                    let (w, x) = match full + j < cols {
                        true => (m.get_raw(r, full + j), xs[t][full + j]),
                        false => (0.0, 0.0),
                    };
                    *aj = w.mul_add(x, *aj);
                }
            } else if !FUSED {
                for (j, aj) in a.iter_mut().enumerate().take(cols - full) {
                    *aj += m.get_raw(r, full + j) * xs[t][full + j];
                }
            }
            out[t * R + k] = match m.data {
                DenseData::I8 { .. } => tree(&a) * m.row_scale(r),
                _ => tree(&a),
            };
        }
    }
}

/// `out[k] = W[r0 + k] · x` for `R` consecutive rows and one input row.
///
/// # Safety
/// As `dot_block` with one input row.
#[target_feature(enable = "neon")]
pub unsafe fn dot_rows<const R: usize>(m: &DenseMatrix, r0: usize, x: &[f32], out: &mut [f32]) {
    dot_block::<R, 1>(m, r0, &[x], out)
}

/// `out[t] = W[r] · xs[t]` for every input row.
///
/// # Safety
/// The CPU must support NEON; `xs` rows have `m.cols` values and `out` one per row.
#[target_feature(enable = "neon")]
pub unsafe fn dot_row_multi(m: &DenseMatrix, r: usize, xs: &[&[f32]], out: &mut [f32]) {
    for (x, o) in xs.iter().zip(out.iter_mut()) {
        dot_block::<1, 1>(m, r, &[x], std::slice::from_mut(o));
    }
}
