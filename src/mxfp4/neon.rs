//! aarch64 NEON kernel, the twin of `x86.rs`: the same decode and the same canonical lane order
//! as the scalar reference (`kernels::rows_scalar`), so every kernel's output is bit-identical.

use std::arch::aarch64::*;

use super::format::{e8m0, Mxfp4Matrix, E2M1, GROUP};
use super::kernels::reduce32;

/// NEON twin of `rows_scalar`: the same `w` per lane, decoded into a 32-entry buffer, and
/// one `vfmaq_f32` per 4 lanes (physical register k, lane i = canonical lane 4k+i).
#[target_feature(enable = "neon")]
pub unsafe fn rows(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&[f32]],
    out: &mut [&mut [f32]],
) {
    for k in 0..nrows {
        let p = m.row_packed(r0 + k);
        let s = m.row_scales(r0 + k);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = [vdupq_n_f32(0.0); 8];
            let mut w = [0f32; 32];
            for g in 0..m.groups() {
                let sc = e8m0(s[g]);
                for b in 0..16 {
                    let byte = p[g * 16 + b];
                    w[2 * b] = E2M1[(byte & 0xF) as usize] * sc;
                    w[2 * b + 1] = E2M1[(byte >> 4) as usize] * sc;
                }
                let xg = &x[g * GROUP..(g + 1) * GROUP];
                for (q, a) in acc.iter_mut().enumerate() {
                    let wv = vld1q_f32(w.as_ptr().add(4 * q));
                    let xv = vld1q_f32(xg.as_ptr().add(4 * q));
                    *a = vfmaq_f32(*a, wv, xv);
                }
            }
            let mut lanes = [0f32; 32];
            for (q, a) in acc.iter().enumerate() {
                vst1q_f32(lanes.as_mut_ptr().add(4 * q), *a);
            }
            o[k] = reduce32(&lanes);
        }
    }
}
