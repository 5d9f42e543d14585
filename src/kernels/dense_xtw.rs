//! `ys[t] = Σ_j xs[t][j] · W[r0 + j]`: `xᵀW` over a block of rows for several inputs (MLA's
//! query absorbed into `kv_b`'s key rows). Each output column sums its rows in `j` order from
//! zero, whatever the number of inputs, so a batch gives every input the bits it gets alone. In
//! `DenseKernel::Exact` each step is the rounded product added (`DenseMatrix::axpy_rows`'s
//! arithmetic, bit for bit); in `Fast` one fused multiply-add. The AVX-512 twin keeps 4 × 16
//! columns of up to 6 inputs in registers, the weights widened once for all of them. Owns no
//! weights and no threads (callers split the work).

use super::dense::{DenseKernel, DenseMatrix};
use crate::{Error, Result};

/// `ys[t·cols + c] = Σ_j xs[t·n + j] · W[r0 + j][c]` for `t` inputs of `n` coefficients.
pub fn xt_w(
    m: &DenseMatrix,
    r0: usize,
    n: usize,
    xs: &[f32],
    t: usize,
    ys: &mut [f32],
) -> Result<()> {
    if r0 + n > m.rows || xs.len() != t * n || ys.len() != t * m.cols {
        return Err(Error::Msg(format!(
            "dense xᵀW: rows {r0}..{} of {}, {} coefficients and {} outputs for {t} inputs",
            r0 + n,
            m.rows,
            xs.len(),
            ys.len()
        )));
    }
    let fused = m.kernel.effective() == DenseKernel::Fast;
    #[cfg(target_arch = "x86_64")]
    if super::dense::use_simd() && super::dense_fma::runs_here() {
        // SAFETY: the features were detected; the sizes were checked above.
        unsafe { simd::xt_w(m, r0, n, (xs, t), ys, fused) };
        return Ok(());
    }
    ys.fill(0.0);
    for (x, y) in xs
        .chunks_exact(n.max(1))
        .zip(ys.chunks_exact_mut(m.cols.max(1)))
    {
        match fused {
            true => m.fused_axpy_rows(r0, x, y),
            false => m.axpy_rows(r0, x, y),
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::super::dense::{DenseData, DenseMatrix, LANES};
    use super::super::dense_fma::{widen16, BF16, F32, I8};

    /// Inputs in flight at most.
    const INPUTS: usize = 6;
    /// Column vectors per block.
    const VECS: usize = 4;

    /// `xt_w` with AVX-512: blocks of up to `VECS` × 16 columns and `INPUTS` inputs.
    ///
    /// # Safety
    /// AVX-512F/BW/VL and FMA present; sizes as `xt_w` checks them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    pub(super) unsafe fn xt_w(
        m: &DenseMatrix,
        r0: usize,
        n: usize,
        (xs, t): (&[f32], usize),
        ys: &mut [f32],
        fused: bool,
    ) {
        match (m.data, fused) {
            (DenseData::Bf16(_), true) => kind::<BF16, true>(m, r0, n, (xs, t), ys),
            (DenseData::Bf16(_), false) => kind::<BF16, false>(m, r0, n, (xs, t), ys),
            (DenseData::F32(_), true) => kind::<F32, true>(m, r0, n, (xs, t), ys),
            (DenseData::F32(_), false) => kind::<F32, false>(m, r0, n, (xs, t), ys),
            (DenseData::I8 { .. }, true) => kind::<I8, true>(m, r0, n, (xs, t), ys),
            (DenseData::I8 { .. }, false) => kind::<I8, false>(m, r0, n, (xs, t), ys),
        }
    }

    /// `xt_w` for storage kind `K`, fused or exact steps.
    ///
    /// # Safety
    /// As `xt_w`; `m.data` is of kind `K`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    unsafe fn kind<const K: u8, const FUSED: bool>(
        m: &DenseMatrix,
        r0: usize,
        n: usize,
        (xs, t): (&[f32], usize),
        ys: &mut [f32],
    ) {
        let cols = m.cols;
        let mut t0 = 0;
        while t0 < t {
            let nt = (t - t0).min(INPUTS);
            let x = &xs[t0 * n..];
            let y = &mut ys[t0 * cols..];
            let mut c = 0;
            while c < cols {
                let left = cols - c;
                let at = (r0, n, c);
                if left >= VECS * LANES {
                    match nt {
                        1 => block::<K, FUSED, VECS, 1>(m, at, x, y),
                        2 => block::<K, FUSED, VECS, 2>(m, at, x, y),
                        3 => block::<K, FUSED, VECS, 3>(m, at, x, y),
                        4 => block::<K, FUSED, VECS, 4>(m, at, x, y),
                        5 => block::<K, FUSED, VECS, 5>(m, at, x, y),
                        _ => block::<K, FUSED, VECS, 6>(m, at, x, y),
                    }
                    c += VECS * LANES;
                } else {
                    match nt {
                        1 => block::<K, FUSED, 1, 1>(m, at, x, y),
                        2 => block::<K, FUSED, 1, 2>(m, at, x, y),
                        3 => block::<K, FUSED, 1, 3>(m, at, x, y),
                        4 => block::<K, FUSED, 1, 4>(m, at, x, y),
                        5 => block::<K, FUSED, 1, 5>(m, at, x, y),
                        _ => block::<K, FUSED, 1, 6>(m, at, x, y),
                    }
                    c += left.min(LANES);
                }
            }
            t0 += nt;
        }
    }

    /// `V` column vectors from `c` (the last one masked where the row ends) for `T` inputs.
    ///
    /// # Safety
    /// As `kind`; `x` holds `T` rows of `n` coefficients and `y` `T` rows of `m.cols` outputs.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
    #[allow(clippy::needless_range_loop)] // accumulators indexed by input and vector
    unsafe fn block<const K: u8, const FUSED: bool, const V: usize, const T: usize>(
        m: &DenseMatrix,
        (r0, n, c): (usize, usize, usize),
        x: &[f32],
        y: &mut [f32],
    ) {
        let cols = m.cols;
        let base = match m.data {
            DenseData::Bf16(b) | DenseData::F32(b) | DenseData::I8 { q: b, .. } => b.as_ptr(),
        };
        let masks: [__mmask16; V] = std::array::from_fn(|q| {
            let left = cols.saturating_sub(c + q * LANES);
            if left >= LANES {
                u16::MAX
            } else {
                (1u16 << left) - 1
            }
        });
        let mut acc = [[_mm512_setzero_ps(); V]; T];
        for j in 0..n {
            let r = r0 + j;
            let scale = _mm512_set1_ps(m.row_scale(r));
            let mut w = [_mm512_setzero_ps(); V];
            for q in 0..V {
                w[q] = widen16::<K>(base, r * cols + c + q * LANES, masks[q]);
                if K == I8 {
                    w[q] = _mm512_mul_ps(w[q], scale);
                }
            }
            for i in 0..T {
                let a = _mm512_set1_ps(*x.get_unchecked(i * n + j));
                for q in 0..V {
                    acc[i][q] = match FUSED {
                        true => _mm512_fmadd_ps(a, w[q], acc[i][q]),
                        false => _mm512_add_ps(acc[i][q], _mm512_mul_ps(a, w[q])),
                    };
                }
            }
        }
        for i in 0..T {
            for q in 0..V {
                let o = y.as_mut_ptr().add(i * cols + c + q * LANES);
                _mm512_mask_storeu_ps(o, masks[q], acc[i][q]);
            }
        }
    }
}
