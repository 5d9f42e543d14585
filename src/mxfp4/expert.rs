//! One routed expert over its raw span bytes (w1 gate, w2 down, w3 up; each packed + scales, in
//! that order): `y = w2 · SiTU(w1 z, w3 z)`.

use super::format::{Mxfp4Matrix, GROUP};
use super::kernels::Kernel;
use crate::{Error, Result};

/// SiTU gated activation in Kimi's operation order:
/// `((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin)`.
#[inline]
pub fn situ(g: f32, u: f32, beta: f32, linear_beta: f32) -> f32 {
    let sig = 1.0 / (1.0 + (-g).exp());
    let gate = (tanh(g / beta) * beta) * sig;
    let up = tanh(u / linear_beta) * linear_beta;
    gate * up
}

/// `tanh` in f64, rounded once to f32. glibc's `tanhf` gives different bits on x86-64 and ARM64
/// (and is an ulp off the rounded f64 value for 3% of inputs); this gave the same bits on both
/// for 40 M inputs, at the same speed (16.5 vs 17.3 ns on x86-64). Measured with glibc, not
/// promised by any libm (macOS's and musl's are others).
#[inline]
pub fn tanh(x: f32) -> f32 {
    (x as f64).tanh() as f32
}

/// A routed expert viewing borrowed raw-v1 bytes.
#[derive(Debug, Clone, Copy)]
pub struct Mxfp4Expert<'a> {
    /// Gate `[inter, latent]`.
    pub w1: Mxfp4Matrix<'a>,
    /// Down `[latent, inter]`.
    pub w2: Mxfp4Matrix<'a>,
    /// Up `[inter, latent]`.
    pub w3: Mxfp4Matrix<'a>,
}

impl<'a> Mxfp4Expert<'a> {
    /// Splits a raw span (`w1p w1s w2p w2s w3p w3s`) for an expert of width `inter` running in
    /// a `latent`-wide space.
    pub fn from_span(bytes: &'a [u8], inter: usize, latent: usize) -> Result<Self> {
        let want = 2 * (inter * latent / 2 + inter * latent / GROUP)
            + latent * inter / 2
            + latent * inter / GROUP;
        if bytes.len() != want {
            return Err(Error::Mxfp4(format!(
                "expert span has {} bytes, expected {want}",
                bytes.len()
            )));
        }
        let mut rest = bytes;
        let mut take = |n: usize| {
            let (a, b) = rest.split_at(n);
            rest = b;
            a
        };
        let (p1, s1) = (take(inter * latent / 2), take(inter * latent / GROUP));
        let (p2, s2) = (take(latent * inter / 2), take(latent * inter / GROUP));
        let (p3, s3) = (take(inter * latent / 2), take(inter * latent / GROUP));
        Ok(Mxfp4Expert {
            w1: Mxfp4Matrix::new(p1, s1, inter, latent)?,
            w2: Mxfp4Matrix::new(p2, s2, latent, inter)?,
            w3: Mxfp4Matrix::new(p3, s3, inter, latent)?,
        })
    }

    /// `ys[t] = w2 · SiTU(w1 zs[t], w3 zs[t])` for `t` latent rows, with the given kernel.
    pub fn forward(
        &self,
        kernel: Kernel,
        zs: &[f32],
        t: usize,
        beta: f32,
        linear_beta: f32,
        parallel: bool,
    ) -> Result<Vec<f32>> {
        let inter = self.w1.rows;
        let mut g = vec![0f32; t * inter];
        let mut u = vec![0f32; t * inter];
        super::gemm_with(kernel, &self.w1, zs, t, &mut g, parallel)?;
        super::gemm_with(kernel, &self.w3, zs, t, &mut u, parallel)?;
        for (gi, ui) in g.iter_mut().zip(&u) {
            *gi = situ(*gi, *ui, beta, linear_beta);
        }
        let mut y = vec![0f32; t * self.w2.rows];
        super::gemm_with(kernel, &self.w2, &g, t, &mut y, parallel)?;
        Ok(y)
    }

    /// Runs several experts the way the MoE layer does: one expert per task on the current
    /// rayon pool, each single-threaded (fewer hand-offs than splitting every GEMV's rows, and
    /// each output is the same whatever thread computes it). `jobs[k]` is an expert, its input
    /// rows `[t, latent]` and `t`.
    pub fn forward_all(
        kernel: Kernel,
        jobs: &[(Mxfp4Expert<'_>, &[f32], usize)],
        beta: f32,
        linear_beta: f32,
    ) -> Result<Vec<Vec<f32>>> {
        use rayon::prelude::*;
        jobs.par_iter()
            .map(|(ex, zs, t)| ex.forward(kernel, zs, *t, beta, linear_beta, false))
            .collect()
    }

    /// Weight bytes of the expert.
    pub fn weight_bytes(&self) -> usize {
        self.w1.weight_bytes() + self.w2.weight_bytes() + self.w3.weight_bytes()
    }
}
