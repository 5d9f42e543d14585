//! The aarch64 int8 kernels: the arithmetic of `int8::rows_scalar` in NEON. A pair of groups is
//! 4 registers of 16 bytes; a table lookup turns each nibble into its doubled E2M1 value (signed,
//! so no offset is needed), and each 4-byte lane's exact `Σ w·q` comes from the dot-product
//! instruction `sdot` (`Kernel::NeonDot`, the `dotprod` feature; written as inline assembly, its
//! intrinsic is not stable) or, on any NEON CPU, from widening multiplies and two pairwise adds
//! (`Kernel::NeonInt8`). Must not change the lane or reduction order `int8.rs` defines.

use std::arch::aarch64::*;

use super::format::Mxfp4Matrix;
use super::int8::{reduce16, Q8Input, E2M1_X2, PAIR};

/// `Kernel::NeonDot`: `out[t][k] = W[r0 + k] · xs[t]` for `nrows` rows.
///
/// # Safety
/// The CPU must support NEON and the dot-product extension.
#[target_feature(enable = "neon,dotprod")]
pub unsafe fn rows_dot(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    rows::<true>(m, r0, nrows, xs, out)
}

/// `Kernel::NeonInt8`: the same without the dot-product extension.
///
/// # Safety
/// The CPU must support NEON.
#[target_feature(enable = "neon")]
pub unsafe fn rows_widening(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    rows::<false>(m, r0, nrows, xs, out)
}

/// Each 4-byte lane's `Σ w·q` (exact: |w·q| ≤ 1,524, so pairs fit 16 bits).
#[inline(always)]
unsafe fn lane_dots<const DOT: bool>(w: int8x16_t, q: int8x16_t) -> int32x4_t {
    if DOT {
        let mut acc = vdupq_n_s32(0);
        std::arch::asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {q:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            q = in(vreg) q,
            options(pure, nomem, nostack),
        );
        acc
    } else {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(q));
        let hi = vmull_high_s8(w, q);
        vpaddlq_s16(vpaddq_s16(lo, hi))
    }
}

#[inline(always)]
unsafe fn rows<const DOT: bool>(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    let groups = m.groups();
    let full = groups / 2;
    let lut = vld1q_s8(E2M1_X2.as_ptr());
    let low4 = vdupq_n_u8(0x0F);
    for k in 0..nrows {
        let p = m.row_packed(r0 + k).as_ptr();
        let s = m.row_scales(r0 + k);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = [vdupq_n_f32(0.0); 4];
            for pair in 0..x.pairs {
                // Bytes 0-15: group 2p's packed bytes, 16-31: group 2p + 1's (zero if absent).
                let b0 = vld1q_u8(p.add(32 * pair));
                let b1 = if pair < full {
                    vld1q_u8(p.add(32 * pair + 16))
                } else {
                    vdupq_n_u8(0)
                };
                let nib = [
                    vandq_u8(b0, low4),
                    vandq_u8(b1, low4),
                    vshrq_n_u8::<4>(b0),
                    vshrq_n_u8::<4>(b1),
                ];
                let sw = |g: usize| {
                    if g < groups {
                        f32::from_bits((s[g] as u32) << 23)
                    } else {
                        0.0
                    }
                };
                let (s0, s1) = (sw(2 * pair), sw(2 * pair + 1));
                for (r, a) in acc.iter_mut().enumerate() {
                    // Register r holds lanes 4r..4r + 4: group 2p for r = 0, 2; 2p + 1 for 1, 3.
                    let w = vqtbl1q_s8(lut, nib[r]);
                    let q = vld1q_s8(x.q.as_ptr().add(PAIR * pair + 16 * r));
                    let dot = lane_dots::<DOT>(w, q);
                    let sa = vld1q_f32(x.sa.as_ptr().add(16 * pair + 4 * r));
                    let c = vmulq_f32(vdupq_n_f32(if r % 2 == 0 { s0 } else { s1 }), sa);
                    *a = vfmaq_f32(*a, vcvtq_f32_s32(dot), c);
                }
            }
            let mut lanes = [0f32; 16];
            for (r, a) in acc.iter().enumerate() {
                vst1q_f32(lanes.as_mut_ptr().add(4 * r), *a);
            }
            o[k] = reduce16(&lanes);
        }
    }
}
