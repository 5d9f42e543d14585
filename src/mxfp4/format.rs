//! The MXFP4 format: E2M1 codes (low nibble first) with one E8M0 scale per 32 inputs.

use crate::{Error, Result};

/// Elements per scale.
pub const GROUP: usize = 32;

/// E2M1 value of each nibble (bit 3 is the sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The scale `2^(s-127)` computed as the fp32 with bit pattern `s << 23` (s = 0 gives +0.0,
/// s = 255 gives +inf, as in the reference kernels).
#[inline(always)]
pub fn e8m0(s: u8) -> f32 {
    f32::from_bits((s as u32) << 23)
}

/// The E2M1 table multiplied by each E8M0 scale (`E2M1[i] · e8m0(s)`, the same fp32 multiply
/// the reference does per weight, so a lookup is bit-identical to it): one 64-byte row per scale
/// byte, 16 KB in all, so a kernel fetches a group's decode table with one aligned load.
#[repr(C, align(64))]
pub struct ScaledTables(pub [[f32; 16]; 256]);

/// The process-wide scaled tables (built once, 4,096 multiplies).
pub fn scaled_tables() -> &'static ScaledTables {
    static T: std::sync::OnceLock<Box<ScaledTables>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new(ScaledTables([[0f32; 16]; 256]));
        for (s, row) in t.0.iter_mut().enumerate() {
            for (v, e) in row.iter_mut().zip(E2M1) {
                *v = e * e8m0(s as u8);
            }
        }
        t
    })
}

/// One MXFP4 matrix `[rows, cols]` over borrowed bytes (`y = W x`, x of length `cols`).
#[derive(Debug, Clone, Copy)]
pub struct Mxfp4Matrix<'a> {
    /// `[rows, cols/2]` packed codes.
    pub packed: &'a [u8],
    /// `[rows, cols/32]` E8M0 scales.
    pub scales: &'a [u8],
    /// Output rows.
    pub rows: usize,
    /// Input columns (a multiple of 32).
    pub cols: usize,
}

impl<'a> Mxfp4Matrix<'a> {
    /// Checks the sizes and wraps the bytes.
    pub fn new(packed: &'a [u8], scales: &'a [u8], rows: usize, cols: usize) -> Result<Self> {
        if !cols.is_multiple_of(GROUP) {
            return Err(Error::Mxfp4(format!(
                "cols {cols} is not a multiple of {GROUP}"
            )));
        }
        if packed.len() != rows * cols / 2 {
            return Err(Error::Mxfp4(format!(
                "packed has {} bytes, [{rows}, {cols}] needs {}",
                packed.len(),
                rows * cols / 2
            )));
        }
        if scales.len() != rows * cols / GROUP {
            return Err(Error::Mxfp4(format!(
                "scales has {} bytes, [{rows}, {cols}] needs {}",
                scales.len(),
                rows * cols / GROUP
            )));
        }
        Ok(Mxfp4Matrix {
            packed,
            scales,
            rows,
            cols,
        })
    }

    /// Number of groups per row.
    pub fn groups(&self) -> usize {
        self.cols / GROUP
    }

    /// Packed bytes of row `r`.
    #[inline(always)]
    pub fn row_packed(&self, r: usize) -> &'a [u8] {
        let n = self.cols / 2;
        &self.packed[r * n..(r + 1) * n]
    }

    /// Scales of row `r`.
    #[inline(always)]
    pub fn row_scales(&self, r: usize) -> &'a [u8] {
        let n = self.cols / GROUP;
        &self.scales[r * n..(r + 1) * n]
    }

    /// Bytes of weight data (packed + scales).
    pub fn weight_bytes(&self) -> usize {
        self.packed.len() + self.scales.len()
    }

    /// The exact element `W[r, c]`.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let b = self.row_packed(r)[c / 2];
        let nib = (b >> (4 * (c % 2))) & 0xF;
        E2M1[nib as usize] * e8m0(self.row_scales(r)[c / GROUP])
    }
}

/// Reference dequantiser: the full fp32 matrix, row-major.
pub fn dequantize(m: &Mxfp4Matrix) -> Vec<f32> {
    let mut out = Vec::with_capacity(m.rows * m.cols);
    for r in 0..m.rows {
        for c in 0..m.cols {
            out.push(m.get(r, c));
        }
    }
    out
}

/// Quantises an fp32 matrix to MXFP4 (round to nearest E2M1 after choosing the smallest scale
/// that fits the group's max); used by tests and fixtures, not by inference.
pub fn quantize(w: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let mut packed = vec![0u8; rows * cols / 2];
    let mut scales = vec![0u8; rows * cols / GROUP];
    for r in 0..rows {
        for g in 0..cols / GROUP {
            let blk = &w[r * cols + g * GROUP..r * cols + (g + 1) * GROUP];
            let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
            let mut s: i32 = if amax > 0.0 {
                (amax / 6.0).log2().ceil() as i32 + 127
            } else {
                127
            };
            s = s.clamp(1, 254);
            let sc = e8m0(s as u8);
            scales[r * cols / GROUP + g] = s as u8;
            for (j, v) in blk.iter().enumerate() {
                let t = v / sc;
                let mut best = 0usize;
                for (k, e) in E2M1.iter().enumerate() {
                    if (e - t).abs() < (E2M1[best] - t).abs() {
                        best = k;
                    }
                }
                let c = g * GROUP + j;
                packed[r * cols / 2 + c / 2] |= (best as u8) << (4 * (c % 2));
            }
        }
    }
    (packed, scales)
}
