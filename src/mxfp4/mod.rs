//! MXFP4 (E2M1 values, E8M0 scale per 32 inputs): exact decode, a reference dequantiser, and
//! fused dequant + GEMV kernels (scalar, AVX2, AVX-512, NEON) that never build the fp32 matrix.
//! Usable on borrowed bytes (`gemv`, `gemm`) and as a Candle op (`matvec`). The int8-activation
//! kernels (`int8.rs`, `Kernel::fastest`) trade the exact bits for speed.
//!
//! On borrowed bytes, and the same product as a Candle op on a tensor:
//!
//! ```
//! use deltafin::mxfp4::{self, Mxfp4Matrix, Mxfp4Weights};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A 2 x 64 matrix: E2M1 codes two per byte (low nibble first), one E8M0 scale per 32 values.
//! let packed = vec![0x22u8; 2 * 64 / 2]; // every code is 2, the value 1.0
//! let scales = [127u8, 127, 128, 128]; // row 0 scaled by 2^0, row 1 by 2^1
//! let x: Vec<f32> = (0..64).map(|i| i as f32).collect();
//! let mut y = [0f32; 2];
//! mxfp4::gemv(&Mxfp4Matrix::new(&packed, &scales, 2, 64)?, &x, &mut y)?;
//! assert_eq!(y, [2016.0, 4032.0]); // the sum of 0..64, then twice it
//!
//! // quantize: f32 weights to the same format; matvec: x · Wᵀ on a Candle tensor.
//! let (packed, scales) = mxfp4::quantize(&[1.0f32; 2 * 64], 2, 64);
//! let w = Mxfp4Weights::new(packed, scales, 2, 64)?;
//! let xt = candle::Tensor::from_vec(x, (1, 64), &candle::Device::Cpu)?;
//! assert_eq!(mxfp4::matvec(&xt, &w)?.to_vec2::<f32>()?, [[2016.0, 2016.0]]);
//! # Ok(()) }
//! ```

pub mod expert;
pub mod format;
pub mod int8;
pub mod kernels;
#[cfg(feature = "metal")]
mod metal;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_int8;
pub mod op;
#[cfg(target_arch = "x86_64")]
pub mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_int8;

pub use expert::{situ, Mxfp4Expert};
pub use format::{dequantize, e8m0, quantize, Mxfp4Matrix, E2M1, GROUP};
pub use kernels::Kernel;
pub use op::{matvec, matvec_io, with_last_dim, MatvecIo, Mxfp4Weights};

use rayon::prelude::*;

use crate::{Error, Result};

/// Least work (weight bytes × input rows) worth splitting across threads.
const PARALLEL_MIN_BYTES: usize = 256 << 10;

/// Rows per parallel task: big enough to amortise scheduling, small enough to balance.
const ROW_TILE: usize = 256;

/// `y = W x` with the fastest kernel, rows split across the rayon pool.
pub fn gemv(m: &Mxfp4Matrix, x: &[f32], y: &mut [f32]) -> Result<()> {
    gemm_with(Kernel::best(), m, x, 1, y, true)
}

/// `ys[t] = W xs[t]` for `t` input rows (`xs` is `[t, cols]`, `ys` is `[t, rows]`): each weight
/// group is decoded once for all rows, and every output equals the single-row call bit for bit.
pub fn gemm(m: &Mxfp4Matrix, xs: &[f32], t: usize, ys: &mut [f32]) -> Result<()> {
    gemm_with(Kernel::best(), m, xs, t, ys, true)
}

/// `gemm` with a chosen kernel, optionally parallel.
pub fn gemm_with(
    kernel: Kernel,
    m: &Mxfp4Matrix,
    xs: &[f32],
    t: usize,
    ys: &mut [f32],
    parallel: bool,
) -> Result<()> {
    if xs.len() != t * m.cols {
        return Err(Error::Mxfp4(format!(
            "input has {} values, expected {t} x {}",
            xs.len(),
            m.cols
        )));
    }
    if ys.len() != t * m.rows {
        return Err(Error::Mxfp4(format!(
            "output has {} values, expected {t} x {}",
            ys.len(),
            m.rows
        )));
    }
    if t == 0 || m.rows == 0 {
        return Ok(());
    }
    // Below a few hundred KB of weights, waking the pool costs more than it saves.
    let parallel = parallel && t * m.weight_bytes() >= PARALLEL_MIN_BYTES;
    if !kernel.is_exact() {
        let q: Vec<int8::Q8Input> = xs.chunks(m.cols).map(int8::Q8Input::new).collect();
        let qr: Vec<&int8::Q8Input> = q.iter().collect();
        tiled(m, t, ys, parallel, |r0, n, outs| {
            int8::rows(kernel, m, r0, n, &qr, outs)
        });
        return Ok(());
    }
    let prepared: Vec<std::borrow::Cow<[f32]>> = xs
        .chunks(m.cols)
        .map(|x| kernels::prepare_x(kernel, x))
        .collect();
    let xr: Vec<&[f32]> = prepared.iter().map(|c| c.as_ref()).collect();
    tiled(m, t, ys, parallel, |r0, n, outs| {
        kernels::rows(kernel, m, r0, n, &xr, outs)
    });
    Ok(())
}

/// Runs `rows(r0, n, outs)` over tiles of `ROW_TILE` weight rows (in parallel when asked) and
/// gathers `[t, rows]` into `ys`; `outs[t]` is the tile's output for input `t`.
fn tiled(
    m: &Mxfp4Matrix,
    t: usize,
    ys: &mut [f32],
    parallel: bool,
    rows: impl Fn(usize, usize, &mut [&mut [f32]]) + Sync,
) {
    if t == 1 {
        let run = |(i, chunk): (usize, &mut [f32])| {
            let n = chunk.len();
            rows(i * ROW_TILE, n, &mut [chunk]);
        };
        if parallel {
            ys.par_chunks_mut(ROW_TILE).enumerate().for_each(run);
        } else {
            ys.chunks_mut(ROW_TILE).enumerate().for_each(run);
        }
        return;
    }
    let tiles = m.rows.div_ceil(ROW_TILE);
    let compute = |i: usize| -> Vec<f32> {
        let r0 = i * ROW_TILE;
        let n = ROW_TILE.min(m.rows - r0);
        let mut buf = vec![0f32; t * n];
        let mut outs: Vec<&mut [f32]> = buf.chunks_mut(n).collect();
        rows(r0, n, &mut outs);
        buf
    };
    let parts: Vec<Vec<f32>> = if parallel {
        (0..tiles).into_par_iter().map(compute).collect()
    } else {
        (0..tiles).map(compute).collect()
    };
    for (i, buf) in parts.iter().enumerate() {
        let r0 = i * ROW_TILE;
        let n = ROW_TILE.min(m.rows - r0);
        for tt in 0..t {
            ys[tt * m.rows + r0..tt * m.rows + r0 + n].copy_from_slice(&buf[tt * n..(tt + 1) * n]);
        }
    }
}

#[cfg(test)]
mod tests;
