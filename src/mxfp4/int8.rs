//! The int8-activation MXFP4 path (`--kernel fast`): each input is quantized per group of 32 to
//! int8 with one fp32 scale (`d = max|x| / 127`, `q = round_ties_even(x · 127 / max|x|)`), each
//! weight is its E2M1 value doubled (an integer in −12..=12), and a group's products are summed
//! exactly in integers before one fp32 multiply-add by both scales. Not bit-identical to the
//! exact kernels (`kernels.rs`): the quantized input is the approximation, and the accuracy
//! gate (`scripts/reference_check.sh`) holds it to mlx-lm's argmax and the exact path's NLL.
//!
//! Every int8 kernel is bit-identical to `rows_scalar` here. The arithmetic is defined over
//! *pairs* of groups (`2p`, `2p + 1`; a missing last group counts as zeros) laid out as 64 bytes:
//! byte `b` holds element `2·(b % 16) + b / 32` of group `2p + (b % 32) / 16` (low nibbles, then
//! high nibbles, of each group's 16 packed bytes). Lane `L ∈ 0..16` owns bytes `4L..4L + 4`; per
//! pair it adds `fma(f32(Σ w·q over its 4 bytes), sw·sa, acc[L])`, where `sw = e8m0(s)` and
//! `sa = d / 2` are its group's scales. The 16 lanes are then reduced as halves: `L + 8`, `L + 4`,
//! `L + 2`, `L + 1`. Owns the quantized input and the scalar reference; must not touch the exact
//! kernels' lane order.

use super::format::{e8m0, Mxfp4Matrix, GROUP};
use super::kernels::Kernel;

/// E2M1 values doubled (exact integers), by nibble.
pub const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// What the int8 kernels add to each doubled weight so it is unsigned (`vpdpbusd` multiplies
/// unsigned by signed bytes); the input's lane sums times this are taken back (`Q8Input::corr`).
pub const WEIGHT_OFFSET: i32 = 12;

/// Bytes of one pair of groups.
pub const PAIR: usize = 2 * GROUP;

/// One input vector quantized for the int8 kernels, in the pair layout.
#[derive(Debug, Clone)]
pub struct Q8Input {
    /// Quantized values, `PAIR` bytes per pair of groups.
    pub q: Vec<i8>,
    /// Per pair, each lane's scale `d / 2` of its group (0 for a missing group).
    pub sa: Vec<f32>,
    /// Per pair, each lane's `−WEIGHT_OFFSET · Σ q` over its 4 bytes.
    pub corr: Vec<i32>,
    /// Pairs (`groups.div_ceil(2)`).
    pub pairs: usize,
}

/// The group of lane `lane` in pair `p` (may be one past the last group).
#[inline(always)]
pub fn lane_group(p: usize, lane: usize) -> usize {
    2 * p + (lane / 4) % 2
}

/// Where byte `b` of pair `p` comes from: (group, element within the group).
#[inline(always)]
pub fn byte_source(p: usize, b: usize) -> (usize, usize) {
    (2 * p + (b % 32) / 16, 2 * (b % 16) + b / 32)
}

impl Q8Input {
    /// Quantizes `x` (length a multiple of 32).
    pub fn new(x: &[f32]) -> Q8Input {
        let groups = x.len() / GROUP;
        let pairs = groups.div_ceil(2);
        let mut q = vec![0i8; pairs * PAIR];
        let mut sa = vec![0f32; pairs * 16];
        let mut corr = vec![0i32; pairs * 16];
        for (g, xg) in x.chunks_exact(GROUP).enumerate() {
            let amax = xg.iter().fold(0f32, |a, v| a.max(v.abs()));
            if !(amax > 0.0 && amax.is_finite()) {
                continue;
            }
            let inv = 127.0 / amax;
            let (p, half) = (g / 2, g % 2);
            for (e, v) in xg.iter().enumerate() {
                // Element e of the group sits at byte 16·half + e/2 (+ 32 for odd e).
                q[p * PAIR + 32 * (e % 2) + 16 * half + e / 2] = round_q(v * inv);
            }
            for lane in (0..16).filter(|l| (l / 4) % 2 == half) {
                sa[p * 16 + lane] = amax / 127.0 / 2.0;
            }
        }
        for (c, bytes) in corr.iter_mut().zip(q.chunks_exact(4)) {
            *c = -WEIGHT_OFFSET * bytes.iter().map(|&v| v as i32).sum::<i32>();
        }
        Q8Input { q, sa, corr, pairs }
    }
}

/// `v` rounded to the nearest integer (ties to even) and clamped to ±127. Adding and taking
/// back 1.5·2^23 rounds in the FPU's default mode (exact for |v| < 2^22): the library call
/// `round_ties_even` becomes on a baseline x86-64 target cost more than the rest of a group.
#[inline(always)]
fn round_q(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    ((v.clamp(-127.0, 127.0) + MAGIC) - MAGIC) as i8
}

/// The fixed reduction of the 16 lanes: halves added lane-wise, down to one.
#[inline(always)]
pub fn reduce16(acc: &[f32; 16]) -> f32 {
    let mut v = *acc;
    let mut n = 16;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            v[i] += v[i + n];
        }
    }
    v[0]
}

/// Reference int8 kernel: `out[t][k] = W[r0 + k] · xs[t]` for a tile of rows.
pub fn rows_scalar(
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    let groups = m.groups();
    for k in 0..nrows {
        let p = m.row_packed(r0 + k);
        let s = m.row_scales(r0 + k);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let mut acc = [0f32; 16];
            for pair in 0..x.pairs {
                for (lane, a) in acc.iter_mut().enumerate() {
                    let g = lane_group(pair, lane);
                    let sw = if g < groups { e8m0(s[g]) } else { 0.0 };
                    let mut dot = 0i32;
                    for b in 4 * lane..4 * lane + 4 {
                        let (g, e) = byte_source(pair, b);
                        let w = if g < groups {
                            E2M1_X2[((p[g * 16 + e / 2] >> (4 * (e % 2))) & 0xF) as usize]
                        } else {
                            0
                        };
                        dot += w as i32 * x.q[pair * PAIR + b] as i32;
                    }
                    *a = (dot as f32).mul_add(sw * x.sa[pair * 16 + lane], *a);
                }
            }
            o[k] = reduce16(&acc);
        }
    }
}

/// Runs the int8 `kernel` on a tile (the reference where the CPU lacks the feature).
pub(crate) fn rows(
    kernel: Kernel,
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&Q8Input],
    out: &mut [&mut [f32]],
) {
    debug_assert!(xs.iter().all(|x| x.pairs == m.groups().div_ceil(2)));
    match kernel.effective() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `effective` returns it only where the CPU has its features.
        Kernel::Vnni512 => unsafe { super::x86_int8::rows_vnni(m, r0, nrows, xs, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Kernel::NeonDot => unsafe { super::neon_int8::rows_dot(m, r0, nrows, xs, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: as above.
        Kernel::NeonInt8 => unsafe { super::neon_int8::rows_widening(m, r0, nrows, xs, out) },
        _ => rows_scalar(m, r0, nrows, xs, out),
    }
}
