//! Fused MXFP4 dequant + dot-product kernels over one weight row.
//!
//! The reduction order is fixed for every variant, so all of them are bit-identical:
//! lane `j ∈ 0..32` accumulates `w[32g+j] · x[32g+j]` over the groups `g` in order with one
//! fp32 FMA per step, where `w = E2M1[nibble] · 2^(s−127)` (exact). At the end the 32 lanes are
//! viewed as 8 accumulators of 4 (`acc[j/4][j%4]`), reduced `((a0+a1)+(a2+a3))+((a4+a5)+(a6+a7))`
//! lane-wise, and the 4 lanes are added `(l0+l1)+(l2+l3)` (spec §2.4). SIMD kernels may keep the
//! lanes in any physical order; they map them back before the final reduction.

use super::format::{e8m0, Mxfp4Matrix, E2M1, GROUP};

/// Which kernel computes a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// Plain Rust, one lane at a time: the reference.
    Scalar,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512F.
    Avx512,
    /// aarch64 NEON.
    Neon,
    /// Int8 activations (`int8.rs`), plain Rust: the reference of the int8 kernels.
    Int8,
    /// Int8 activations with x86-64 AVX-512 VNNI (`vpdpbusd`).
    Vnni512,
    /// Int8 activations with aarch64's dot-product extension (`sdot`).
    NeonDot,
    /// Int8 activations with plain aarch64 NEON (widening multiplies).
    NeonInt8,
}

impl Kernel {
    /// Every kernel, exact ones first.
    pub const ALL: [Kernel; 8] = [
        Kernel::Scalar,
        Kernel::Avx2,
        Kernel::Avx512,
        Kernel::Neon,
        Kernel::Int8,
        Kernel::Vnni512,
        Kernel::NeonDot,
        Kernel::NeonInt8,
    ];

    /// The fastest exact kernel this CPU supports (bit-identical to `Scalar`): `--kernel exact`.
    pub fn best() -> Kernel {
        [Kernel::Avx512, Kernel::Avx2, Kernel::Neon]
            .into_iter()
            .find(|k| k.runs_here())
            .unwrap_or(Kernel::Scalar)
    }

    /// The fastest kernel of all (`--kernel fast`): int8 activations where the CPU has a
    /// dot-product instruction for them (only there do they win), else `best`.
    pub fn fastest() -> Kernel {
        [Kernel::Vnni512, Kernel::NeonDot, Kernel::NeonInt8]
            .into_iter()
            .find(|k| k.runs_here())
            .unwrap_or_else(Kernel::best)
    }

    /// Whether this kernel gives the exact path's bits (`Scalar`'s); the int8 ones do not.
    pub fn is_exact(self) -> bool {
        !matches!(
            self,
            Kernel::Int8 | Kernel::Vnni512 | Kernel::NeonDot | Kernel::NeonInt8
        )
    }

    /// Whether this CPU has what the kernel needs (the plain-Rust ones run everywhere).
    fn runs_here(self) -> bool {
        match self {
            Kernel::Scalar | Kernel::Int8 => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Vnni512 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bw")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonDot => {
                std::arch::is_aarch64_feature_detected!("neon")
                    && std::arch::is_aarch64_feature_detected!("dotprod")
            }
            #[cfg(target_arch = "aarch64")]
            Kernel::NeonInt8 => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every kernel this CPU can run, exact ones first.
    pub fn available() -> Vec<Kernel> {
        Kernel::ALL.into_iter().filter(|k| k.runs_here()).collect()
    }

    /// The kernel that actually runs when `self` is asked for: itself when this CPU supports it,
    /// else the plain-Rust kernel of the same arithmetic (`Scalar`, or `Int8` for an int8 one).
    pub fn effective(self) -> Kernel {
        if self.runs_here() {
            self
        } else if self.is_exact() {
            Kernel::Scalar
        } else {
            Kernel::Int8
        }
    }

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Scalar => "scalar",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Neon => "neon",
            Kernel::Int8 => "int8",
            Kernel::Vnni512 => "avx512-vnni",
            Kernel::NeonDot => "neon-dot",
            Kernel::NeonInt8 => "neon-int8",
        }
    }
}

/// The fixed final reduction of 32 canonical lanes.
#[inline(always)]
pub fn reduce32(acc: &[f32; 32]) -> f32 {
    let mut s = [0f32; 4];
    for (i, si) in s.iter_mut().enumerate() {
        let a = |k: usize| acc[4 * k + i];
        *si = ((a(0) + a(1)) + (a(2) + a(3))) + ((a(4) + a(5)) + (a(6) + a(7)));
    }
    (s[0] + s[1]) + (s[2] + s[3])
}

/// Reference kernel for a tile of rows and up to `xs.len()` input vectors:
/// `out[t][k] = W[r0 + k] · xs[t]`.
pub fn rows_scalar(
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
            let mut acc = [0f32; 32];
            for g in 0..m.groups() {
                let sc = e8m0(s[g]);
                for (j, a) in acc.iter_mut().enumerate() {
                    let b = p[g * GROUP / 2 + j / 2];
                    let w = E2M1[((b >> (4 * (j % 2))) & 0xF) as usize] * sc;
                    *a = w.mul_add(x[g * GROUP + j], *a);
                }
            }
            o[k] = reduce32(&acc);
        }
    }
}

/// Runs `kernel` on a tile; `xs` must already be in the kernel's lane order (`prepare_x`).
/// Falls back to the reference when the CPU lacks the feature.
pub(crate) fn rows(
    kernel: Kernel,
    m: &Mxfp4Matrix,
    r0: usize,
    nrows: usize,
    xs: &[&[f32]],
    out: &mut [&mut [f32]],
) {
    debug_assert!(xs.iter().all(|x| x.len() == m.cols));
    debug_assert!(out.iter().all(|o| o.len() >= nrows));
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 if std::is_x86_feature_detected!("avx512f") => {
            // SAFETY: the feature was detected at run time.
            unsafe { super::x86::rows_avx512(m, r0, nrows, xs, out) }
        }
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") =>
        {
            // SAFETY: the features were detected at run time.
            unsafe { super::x86::rows_avx2(m, r0, nrows, xs, out) }
        }
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon if std::arch::is_aarch64_feature_detected!("neon") => {
            // SAFETY: the feature was detected at run time.
            unsafe { super::neon::rows(m, r0, nrows, xs, out) }
        }
        _ => rows_scalar(m, r0, nrows, xs, out),
    }
}

/// Puts an input vector into the lane order `kernel` expects.
pub fn prepare_x(kernel: Kernel, x: &[f32]) -> std::borrow::Cow<'_, [f32]> {
    match kernel.effective() {
        #[cfg(target_arch = "x86_64")]
        k @ (Kernel::Avx2 | Kernel::Avx512) => std::borrow::Cow::Owned(super::x86::permute_x(k, x)),
        _ => std::borrow::Cow::Borrowed(x),
    }
}
