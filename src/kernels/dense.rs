//! Dense spine matrices over borrowed bytes (BF16, F32, or row-int8 with f16 row scales) and
//! the fused GEMV/GEMM that reads them directly: weights are widened (or dequantised) in
//! registers, never copied to an fp32 matrix.
//!
//! Every output row is computed by the same function with a fixed reduction order (16 lanes,
//! then a pairwise tree), whatever the number of input rows or threads, so batched and
//! single-row calls agree bit for bit.

use rayon::prelude::*;

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
    /// Fused multiply-adds in the same lanes and tree (`dense_fma`, x86-64 with AVX-512F):
    /// still batch-independent, not bit-identical to `Exact`. Elsewhere the exact arithmetic.
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

    /// What this choice runs on this CPU: `Fast` only where its kernel exists.
    pub fn effective(self) -> DenseKernel {
        #[cfg(target_arch = "x86_64")]
        if self == DenseKernel::Fast && super::dense_fma::runs_here() {
            return DenseKernel::Fast;
        }
        DenseKernel::Exact
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
    /// block of rows, with each weight widened (or dequantised) in registers.
    pub fn axpy_rows(&self, r0: usize, coeffs: &[f32], out: &mut [f32]) {
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
                        *o += a * f32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    }
                }
                DenseData::Bf16(b) => {
                    for (o, w) in out
                        .iter_mut()
                        .zip(b[2 * r * c..2 * (r + 1) * c].chunks_exact(2))
                    {
                        *o += a * f32::from_bits((u16::from_le_bytes([w[0], w[1]]) as u32) << 16);
                    }
                }
                DenseData::I8 { q, .. } => {
                    let sc = self.row_scale(r);
                    for (o, &v) in out.iter_mut().zip(&q[r * c..(r + 1) * c]) {
                        *o += a * (v as i8 as f32 * sc);
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

/// Keeps the dense kernels off their SIMD twins (AVX-512, NEON) for the rest of the process (the binary sets it from
/// `DELTAFIN_PORTABLE_DENSE`, to compare kernels); call it before the first matrix runs.
pub fn use_portable_kernels() {
    PORTABLE.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The SIMD twin of the portable kernel on this architecture (bit-identical to it).
#[cfg(target_arch = "aarch64")]
use super::dense_neon as simd;
#[cfg(target_arch = "x86_64")]
use super::dense_x86 as simd;

/// Whether the SIMD twin runs: the CPU has it (AVX-512F, NEON) and the portable kernel was not
/// asked for.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn use_simd() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let has = std::is_x86_feature_detected!("avx512f");
        #[cfg(target_arch = "aarch64")]
        let has = std::arch::is_aarch64_feature_detected!("neon");
        has && !PORTABLE.load(std::sync::atomic::Ordering::Relaxed)
    })
}

/// Decode (one input row): rows `r0..r0+n` eight (then four) at a time with the SIMD kernel (a single
/// row's lane chain is add-latency bound); returns how many leading rows it computed (0 where
/// the kernel is unavailable).
fn rows_in_flight(m: &DenseMatrix, r0: usize, n: usize, x: &[f32], out: &mut [f32]) -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if use_simd() {
        let mut k = 0;
        while k + 8 <= n {
            // SAFETY: the feature was detected; rows r0+k..r0+k+8 exist and x has m.cols values.
            unsafe { simd::dot_rows::<8>(m, r0 + k, x, &mut out[k..k + 8]) };
            k += 8;
        }
        while k + 4 <= n {
            // SAFETY: the feature was detected; rows r0+k..r0+k+4 exist and x has m.cols values.
            unsafe { simd::dot_rows::<4>(m, r0 + k, x, &mut out[k..k + 4]) };
            k += 4;
        }
        return k;
    }
    let _ = (m, r0, n, x, out);
    0
}

/// Several input rows (a batched pass, a prefill chunk): rows `r0..r0+n` four at a time against
/// up to four inputs at a time with the SIMD block kernel (16 lane chains in flight, each
/// chunk of weights widened once per four inputs); writes `out[t * n + k]` and returns how many
/// leading rows it computed (0 where the kernel is unavailable).
fn rows_batched(m: &DenseMatrix, r0: usize, n: usize, xs: &[&[f32]], out: &mut [f32]) -> usize {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if use_simd() {
        use simd::dot_block;
        const R: usize = 4;
        let t = xs.len();
        let mut block = [0f32; R * 4];
        let mut k = 0;
        while k + R <= n {
            let mut t0 = 0;
            while t0 < t {
                let nt = (t - t0).min(4);
                let x = &xs[t0..t0 + nt];
                // SAFETY: the feature was detected; rows r0+k..r0+k+R exist, every input row has
                // m.cols values (checked by `gemm`) and `block` holds R·nt values.
                unsafe {
                    match nt {
                        4 => dot_block::<R, 4>(m, r0 + k, x, &mut block),
                        3 => dot_block::<R, 3>(m, r0 + k, x, &mut block),
                        2 => dot_block::<R, 2>(m, r0 + k, x, &mut block),
                        _ => dot_block::<R, 1>(m, r0 + k, x, &mut block),
                    }
                }
                for tt in 0..nt {
                    out[(t0 + tt) * n + k..(t0 + tt) * n + k + R]
                        .copy_from_slice(&block[tt * R..(tt + 1) * R]);
                }
                t0 += nt;
            }
            k += R;
        }
        return k;
    }
    let _ = (m, r0, n, xs, out);
    0
}

/// Least work (weight bytes × rows of input) worth splitting across threads.
const PARALLEL_MIN_BYTES: usize = 256 << 10;
const ROW_TILE: usize = 32;

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
    #[cfg(target_arch = "x86_64")]
    if m.kernel.effective() == DenseKernel::Fast {
        super::dense_fma::gemm(m, xs, t, ys);
        return Ok(());
    }
    let rows = m.rows;
    // One (possibly empty) slice per input row, also when the rows have no columns.
    let xr: Vec<&[f32]> = (0..t).map(|i| &xs[i * m.cols..(i + 1) * m.cols]).collect();
    let work = |tile: usize, out: &mut [f32]| {
        // out holds rows tile*ROW_TILE.. for every t: [t][n]
        let r0 = tile * ROW_TILE;
        let n = ROW_TILE.min(rows - r0);
        let mut one = vec![0f32; t];
        let done = if t == 1 {
            rows_in_flight(m, r0, n, xr[0], out)
        } else {
            rows_batched(m, r0, n, &xr, out)
        };
        for k in done..n {
            m.dot_row_multi(r0 + k, &xr, &mut one);
            for tt in 0..t {
                out[tt * n + k] = one[tt];
            }
        }
    };
    let tiles = rows.div_ceil(ROW_TILE);
    let parts: Vec<Vec<f32>> = if m.bytes() * t >= PARALLEL_MIN_BYTES {
        (0..tiles)
            .into_par_iter()
            .map(|i| {
                let mut o = vec![0f32; t * ROW_TILE.min(rows - i * ROW_TILE)];
                work(i, &mut o);
                o
            })
            .collect()
    } else {
        (0..tiles)
            .map(|i| {
                let mut o = vec![0f32; t * ROW_TILE.min(rows - i * ROW_TILE)];
                work(i, &mut o);
                o
            })
            .collect()
    };
    for (i, o) in parts.iter().enumerate() {
        let r0 = i * ROW_TILE;
        let n = ROW_TILE.min(rows - r0);
        for tt in 0..t {
            ys[tt * rows + r0..tt * rows + r0 + n].copy_from_slice(&o[tt * n..(tt + 1) * n]);
        }
    }
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
