//! Dense spine matrices over borrowed bytes (BF16, F32, or row-int8 with f16 row scales) and
//! the fused GEMV/GEMM that reads them directly: weights are widened (or dequantised) in
//! registers, never copied to an fp32 matrix.
//!
//! Every output row is computed by the same function with a fixed reduction order (16 lanes,
//! then a pairwise tree), whatever the number of input rows or threads, so batched and
//! single-row calls agree bit for bit.

use crate::{Error, Result};

/// Element storage of a dense matrix.
#[derive(Debug, Clone, Copy)]
pub enum DenseData<'a> {
    /// Little-endian f32.
    F32(&'a [u8]),
    /// Little-endian bf16.
    Bf16(&'a [u8]),
    /// Row-int8: `q` `[rows, cols]` i8 and one little-endian f16 scale per row.
    I8 {
        /// Quantised values.
        q: &'a [u8],
        /// Row scales (f16).
        scales: &'a [u8],
    },
}

/// A `[rows, cols]` matrix view (`y = W x`).
#[derive(Debug, Clone, Copy)]
pub struct DenseMatrix<'a> {
    /// The bytes.
    pub data: DenseData<'a>,
    /// Output rows.
    pub rows: usize,
    /// Input columns.
    pub cols: usize,
    /// Where the same bytes lie on the compute device (a template layer), if anywhere.
    pub device: Option<DeviceRef<'a>>,
    /// The arithmetic the host kernels use for it.
    pub kernel: DenseKernel,
}

/// The host arithmetic of a dense matrix (`--kernel`, with the experts' `mxfp4::Kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseKernel {
    /// The weights widened to fp32 and multiplied in fp32, in a fixed order: the reference.
    #[default]
    Exact,
    /// Fused multiply-adds in the same lanes and tree (`DenseMatrix::fused_dot_row`; SIMD:
    /// `dense_fma` on x86-64 with AVX-512F, `dense_neon` on aarch64), and in `dense_xtw::xt_w`
    /// one fused step per row in row order (AVX-512 on x86-64, `f32::mul_add` elsewhere): still
    /// batch-independent, the same bits on both, not bit-identical to `Exact`. On other CPUs
    /// the exact arithmetic.
    Fast,
}

impl DenseKernel {
    /// The `--kernel` word for it.
    pub fn name(self) -> &'static str {
        match self {
            DenseKernel::Exact => "exact",
            DenseKernel::Fast => "fast",
        }
    }

    /// What this choice runs on this CPU: `Fast` only where a fused SIMD kernel exists (the
    /// portable form, `f32::mul_add`, is a library call on a CPU without FMA).
    pub fn effective(self) -> DenseKernel {
        #[cfg(target_arch = "x86_64")]
        let fused = super::dense_fma::runs_here();
        #[cfg(target_arch = "aarch64")]
        let fused = std::arch::is_aarch64_feature_detected!("neon");
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let fused = false;
        match (self, fused) {
            (DenseKernel::Fast, true) => DenseKernel::Fast,
            _ => DenseKernel::Exact,
        }
    }
}

/// Lanes of the dense reduction.
pub(crate) const LANES: usize = 16;

/// The fixed final reduction of the 16 lanes (pairwise halves); shared by every kernel.
#[inline(always)]
pub(crate) fn tree(acc: &[f32; LANES]) -> f32 {
    let mut a = *acc;
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            a[i] += a[i + w];
        }
        w /= 2;
    }
    a[0]
}

#[inline(always)]
fn dot_with(x: &[f32], w: impl Fn(usize) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let n = x.len();
    let full = n - n % LANES;
    let mut c = 0;
    while c < full {
        for (j, a) in acc.iter_mut().enumerate() {
            *a += w(c + j) * x[c + j];
        }
        c += LANES;
    }
    for (j, a) in acc.iter_mut().enumerate().take(n - full) {
        *a += w(full + j) * x[full + j];
    }
    tree(&acc)
}

impl<'a> DenseMatrix<'a> {
    /// Checks the byte sizes.
    pub fn new(data: DenseData<'a>, rows: usize, cols: usize) -> Result<Self> {
        let n = rows * cols;
        let ok = match data {
            DenseData::F32(b) => b.len() == 4 * n,
            DenseData::Bf16(b) => b.len() == 2 * n,
            DenseData::I8 { q, scales } => q.len() == n && scales.len() == 2 * rows,
        };
        if !ok {
            return Err(Error::Msg(format!(
                "dense matrix [{rows}, {cols}]: byte size does not match"
            )));
        }
        Ok(DenseMatrix {
            data,
            rows,
            cols,
            device: None,
            kernel: DenseKernel::Exact,
        })
    }

    /// The same matrix computed with `kernel`.
    pub fn with_kernel(mut self, kernel: DenseKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// Rows `r0..r0 + n` as a matrix of their own: the same bytes and kernel, no device copy.
    pub fn row_range(&self, r0: usize, n: usize) -> Result<DenseMatrix<'a>> {
        if r0 + n > self.rows {
            return Err(Error::Msg(format!(
                "dense matrix rows {r0}..{} of {}",
                r0 + n,
                self.rows
            )));
        }
        let c = self.cols;
        let data = match self.data {
            DenseData::F32(b) => DenseData::F32(&b[4 * r0 * c..4 * (r0 + n) * c]),
            DenseData::Bf16(b) => DenseData::Bf16(&b[2 * r0 * c..2 * (r0 + n) * c]),
            DenseData::I8 { q, scales } => DenseData::I8 {
                q: &q[r0 * c..(r0 + n) * c],
                scales: &scales[2 * r0..2 * (r0 + n)],
            },
        };
        Ok(DenseMatrix {
            data,
            rows: n,
            cols: c,
            device: None,
            kernel: self.kernel,
        })
    }

    /// Weight bytes read per use.
    pub fn bytes(&self) -> usize {
        match self.data {
            DenseData::F32(b) | DenseData::Bf16(b) => b.len(),
            DenseData::I8 { q, scales } => q.len() + scales.len(),
        }
    }

    /// `W[r] · x`.
    #[inline]
    pub fn dot_row(&self, r: usize, x: &[f32]) -> f32 {
        let c = self.cols;
        match self.data {
            DenseData::F32(b) => {
                let row = &b[4 * r * c..4 * (r + 1) * c];
                dot_with(x, |i| {
                    f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
                })
            }
            DenseData::Bf16(b) => {
                let row = &b[2 * r * c..2 * (r + 1) * c];
                dot_with(x, |i| {
                    f32::from_bits((u16::from_le_bytes([row[2 * i], row[2 * i + 1]]) as u32) << 16)
                })
            }
            DenseData::I8 { q, .. } => {
                let row = &q[r * c..(r + 1) * c];
                dot_with(x, |i| row[i] as i8 as f32) * self.row_scale(r)
            }
        }
    }

    /// `W[r] · x` in `DenseKernel::Fast`'s arithmetic: `dot_row`'s lanes, order and tree, each
    /// step one fused multiply-add, a last partial chunk's missing columns zero in both operands
    /// (`0·0 + acc`, as the SIMD kernels' masked loads give). The SIMD kernels equal it bit for
    /// bit; it serves where the portable kernels were asked for.
    pub fn fused_dot_row(&self, r: usize, x: &[f32]) -> f32 {
        let mut acc = [0f32; LANES];
        for c0 in (0..self.cols).step_by(LANES) {
            for (j, a) in acc.iter_mut().enumerate() {
                let c = c0 + j;
                let (w, xv) = match c < self.cols {
                    true => (self.get_raw(r, c), x[c]),
                    false => (0.0, 0.0),
                };
                *a = w.mul_add(xv, *a);
            }
        }
        tree(&acc) * self.row_scale(r)
    }

    /// The stored value at `[r, c]` before the row scale (int8: `q`; otherwise the weight).
    #[inline(always)]
    pub fn get_raw(&self, r: usize, c: usize) -> f32 {
        let i = r * self.cols + c;
        match self.data {
            DenseData::F32(b) => {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
            DenseData::Bf16(b) => {
                f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
            }
            DenseData::I8 { q, .. } => q[i] as i8 as f32,
        }
    }

    /// `out[t] = W[r] · xs[t]` with the fastest kernel (all kernels agree bit for bit).
    pub fn dot_row_multi(&self, r: usize, xs: &[&[f32]], out: &mut [f32]) {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if use_simd() {
            // SAFETY: the feature was detected; sizes were checked by the caller.
            unsafe { simd::dot_row_multi(self, r, xs, out) };
            return;
        }
        for (o, x) in out.iter_mut().zip(xs) {
            *o = self.dot_row(r, x);
        }
    }

    /// The row scale (int8: the f16 scale; otherwise 1).
    #[inline(always)]
    pub fn row_scale(&self, r: usize) -> f32 {
        match self.data {
            DenseData::I8 { scales, .. } => {
                half::f16::from_le_bytes([scales[2 * r], scales[2 * r + 1]]).to_f32()
            }
            _ => 1.0,
        }
    }

    /// The element `W[r, c]` as f32 (reference path).
    pub fn get(&self, r: usize, c: usize) -> f32 {
        self.get_raw(r, c) * self.row_scale(r)
    }

    /// `out += Σ_j coeffs[j] · W[r0 + j]` (rows `r0..r0+coeffs.len()`, in `j` order): `xᵀW` over a
    /// block of rows, with each weight widened (or dequantised) in registers; each step the
    /// rounded product added. The reference of `dense_xtw::xt_w`'s exact steps.
    pub fn axpy_rows(&self, r0: usize, coeffs: &[f32], out: &mut [f32]) {
        self.accumulate_rows(r0, coeffs, out, |o, a, w| o + a * w);
    }

    /// `axpy_rows` with one fused multiply-add per step (`xt_w`'s fast steps).
    pub(crate) fn fused_axpy_rows(&self, r0: usize, coeffs: &[f32], out: &mut [f32]) {
        self.accumulate_rows(r0, coeffs, out, |o, a, w| a.mul_add(w, o));
    }

    /// `out[c] = step(out[c], coeffs[j], W[r0 + j][c])` for each row in `j` order.
    #[inline]
    fn accumulate_rows(
        &self,
        r0: usize,
        coeffs: &[f32],
        out: &mut [f32],
        step: impl Fn(f32, f32, f32) -> f32,
    ) {
        let c = self.cols;
        debug_assert_eq!(out.len(), c);
        for (j, &a) in coeffs.iter().enumerate() {
            let r = r0 + j;
            match self.data {
                DenseData::F32(b) => {
                    for (o, w) in out
                        .iter_mut()
                        .zip(b[4 * r * c..4 * (r + 1) * c].chunks_exact(4))
                    {
                        *o = step(*o, a, f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                    }
                }
                DenseData::Bf16(b) => {
                    for (o, w) in out
                        .iter_mut()
                        .zip(b[2 * r * c..2 * (r + 1) * c].chunks_exact(2))
                    {
                        let v = f32::from_bits((u16::from_le_bytes([w[0], w[1]]) as u32) << 16);
                        *o = step(*o, a, v);
                    }
                }
                DenseData::I8 { q, .. } => {
                    let sc = self.row_scale(r);
                    for (o, &v) in out.iter_mut().zip(&q[r * c..(r + 1) * c]) {
                        *o = step(*o, a, v as i8 as f32 * sc);
                    }
                }
            }
        }
    }

    /// The whole matrix as row-major f32 (for the few uses that need a tensor).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.data {
            DenseData::F32(b) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            DenseData::Bf16(b) => b
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            DenseData::I8 { q, .. } => {
                let mut out = Vec::with_capacity(self.rows * self.cols);
                for (r, row) in q.chunks_exact(self.cols.max(1)).enumerate() {
                    let s = self.row_scale(r);
                    out.extend(row.iter().map(|&v| v as i8 as f32 * s));
                }
                out
            }
        }
    }
}

static PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Keeps the dense kernels off their SIMD twins (AVX-512, NEON) for the rest of the process
/// (the binary sets it from `DELTAFIN_PORTABLE_DENSE`, to compare kernels); call it before the
/// first matrix runs.
pub fn use_portable_kernels() {
    PORTABLE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The SIMD twin of the portable kernel on this architecture (bit-identical to it).
#[cfg(target_arch = "aarch64")]
pub(super) use super::dense_neon as simd;
#[cfg(target_arch = "x86_64")]
pub(super) use super::dense_x86 as simd;

/// Whether the SIMD twin runs: the CPU has it (AVX-512F, NEON) and the portable kernel was not
/// asked for.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(super) fn use_simd() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let has = std::is_x86_feature_detected!("avx512f");
        #[cfg(target_arch = "aarch64")]
        let has = std::arch::is_aarch64_feature_detected!("neon");
        has && !PORTABLE.load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// `ys[t] = W xs[t]` for `t` input rows (`xs` `[t, cols]`, `ys` `[t, rows]`).
pub fn gemm(m: &DenseMatrix, xs: &[f32], t: usize, ys: &mut [f32]) -> Result<()> {
    if xs.len() != t * m.cols || ys.len() != t * m.rows {
        return Err(Error::Msg(format!(
            "dense gemm: input {} / output {} values for {t} rows of a [{}, {}] matrix",
            xs.len(),
            ys.len(),
            m.rows,
            m.cols
        )));
    }
    super::dense_gemm::run(m, xs, t, ys);
    Ok(())
}

/// Row-int8 quantisation of one row (spec §5 item 2): `scale = max|w|/127` in f32 (1 for an
/// all-zero row), `q = clamp(round_half_even(w/scale), −127, 127)`, the scale stored as f16.
pub fn quantize_row_int8(row: &[f32]) -> (Vec<i8>, half::f16) {
    let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = if amax == 0.0 { 1.0 } else { amax / 127.0 };
    let q = row
        .iter()
        .map(|&w| (w / scale).round_ties_even().clamp(-127.0, 127.0) as i8)
        .collect();
    (q, half::f16::from_f32(scale))
}

#[cfg(test)]
#[path = "dense_tests.rs"]
mod tests;

/// Where a matrix's bytes lie in its layer's device copy.
#[derive(Debug, Clone, Copy)]
pub struct DeviceRef<'a> {
    /// The layer's copy (the spine's `DeviceCopy`, opaque: `compute` downcasts it).
    pub copy: &'a (dyn std::any::Any + Send + Sync),
    /// Byte offset of the matrix in the layer.
    pub data: usize,
    /// Byte offset of its row scales (row-int8), else equal to `data`.
    pub scales: usize,
}
