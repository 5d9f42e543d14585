//! One routed expert's feed-forward network, described as a value: its weight format (MXFP4 or
//! BF16), its parts and their order in the expert's bytes, an optional bias per matrix, whether
//! gate and up are separate or one interleaved matrix, and its GLU activation. From the
//! description come the store's `ExpertLayout` and the host forward over an expert's borrowed
//! bytes (the fused MXFP4 and dense kernels; no fp32 copy of a weight). Knows no model.

use super::ExecOptions;
use crate::checkpoint::{Dtype, ExpertLayout};
use crate::kernels::dense::{DenseData, DenseMatrix};
use crate::mxfp4::{self, Mxfp4Matrix, GROUP};
use crate::{Error, Result};

/// How the expert's matrices are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// MXFP4: packed E2M1 codes `[rows, cols/2]` and E8M0 scales `[rows, cols/32]` (U8).
    Mxfp4,
    /// BF16 `[rows, cols]`.
    Bf16,
}

/// Whether gate and up are two matrices or one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GluLayout {
    /// `gate` `[inter, width]` and `up` `[inter, width]`.
    Separate,
    /// One `gate_up` `[2·inter, width]` whose even rows are the gate and odd rows the up
    /// (gpt-oss).
    Interleaved,
}

/// The gated activation `act(gate, up)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// Kimi's SiTU: `((tanh(g/β)·β)·σ(g)) · (tanh(u/β_lin)·β_lin)`.
    Situ {
        /// β of the gate.
        beta: f32,
        /// β of the up projection.
        linear_beta: f32,
    },
    /// gpt-oss's SwiGLU: `g = min(g, limit)`, `u = clamp(u, ±limit)`, `g·σ(α·g)·(u + 1)`.
    SwiGluOai {
        /// α (1.702 in gpt-oss).
        alpha: f32,
        /// The clamp (7 in gpt-oss).
        limit: f32,
    },
    /// SwiGLU: `silu(g) · u` (Qwen3-MoE, Mixtral, DeepSeek).
    Silu,
}

impl Activation {
    /// `act(g, u)` for one element.
    #[inline]
    pub fn apply(&self, g: f32, u: f32) -> f32 {
        match *self {
            Activation::Situ { beta, linear_beta } => mxfp4::situ(g, u, beta, linear_beta),
            Activation::SwiGluOai { alpha, limit } => {
                let g = g.min(limit);
                let u = u.clamp(-limit, limit);
                g * (1.0 / (1.0 + (-alpha * g).exp())) * (u + 1.0)
            }
            Activation::Silu => g / (1.0 + (-g).exp()) * u,
        }
    }
}

/// A matrix of the expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matrix {
    /// `[inter, width]` (`GluLayout::Separate`).
    Gate,
    /// `[inter, width]` (`GluLayout::Separate`).
    Up,
    /// `[2·inter, width]`, rows interleaved (`GluLayout::Interleaved`).
    GateUp,
    /// `[width, inter]`.
    Down,
}

/// What a part holds of its matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// MXFP4 packed codes (U8).
    Packed,
    /// MXFP4 E8M0 scales (U8).
    Scales,
    /// BF16 weights.
    Weight,
    /// The bias, one value per output row, BF16.
    Bias,
}

/// One stored part: which matrix and what of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    /// The matrix.
    pub matrix: Matrix,
    /// What of it.
    pub kind: PartKind,
}

/// One routed expert: `down · act(gate·x + b_g, up·x + b_u) + b_d`, `x` `width` wide.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertFfn {
    /// The weight format.
    pub format: WeightFormat,
    /// Input and output width.
    pub width: usize,
    /// Intermediate width (of gate and up each).
    pub inter: usize,
    /// Gate and up separate or interleaved.
    pub glu: GluLayout,
    /// The gated activation.
    pub activation: Activation,
    /// The parts in the order of the expert's bytes (an expert's canonical span).
    pub parts: Vec<Part>,
}

impl ExpertFfn {
    /// `[rows, cols]` of a matrix.
    pub fn matrix_shape(&self, m: Matrix) -> (usize, usize) {
        match m {
            Matrix::Gate | Matrix::Up => (self.inter, self.width),
            Matrix::GateUp => (2 * self.inter, self.width),
            Matrix::Down => (self.width, self.inter),
        }
    }

    /// The store's layout: each part's shape and dtype, in order.
    pub fn layout(&self) -> ExpertLayout {
        ExpertLayout::from_parts(
            self.parts
                .iter()
                .map(|p| {
                    let (r, c) = self.matrix_shape(p.matrix);
                    match p.kind {
                        PartKind::Packed => (vec![r, c / 2], Dtype::U8),
                        PartKind::Scales => (vec![r, c / GROUP], Dtype::U8),
                        PartKind::Weight => (vec![r, c], Dtype::BF16),
                        PartKind::Bias => (vec![r], Dtype::BF16),
                    }
                })
                .collect(),
        )
    }

    /// The bytes of one part within an expert's span (`at`: each part's offset and size).
    fn part<'a>(
        &self,
        bytes: &'a [u8],
        at: &[(usize, usize)],
        matrix: Matrix,
        kind: PartKind,
    ) -> Option<&'a [u8]> {
        let i = self
            .parts
            .iter()
            .position(|p| p.matrix == matrix && p.kind == kind)?;
        let (o, n) = at[i];
        Some(&bytes[o..o + n])
    }

    /// `(beta, linear_beta)` when the expert is what the Metal kernels run: MXFP4, separate gate
    /// and up, no biases, SiTU, parts in K3's order (gate, down, up; packed before scales).
    pub fn metal_situ(&self) -> Option<(f32, f32)> {
        use {Matrix::*, PartKind::*};
        let order = [
            (Gate, Packed),
            (Gate, Scales),
            (Down, Packed),
            (Down, Scales),
        ];
        let k3_order = order
            .iter()
            .chain(&[(Up, Packed), (Up, Scales)])
            .map(|&(matrix, kind)| Part { matrix, kind })
            .eq(self.parts.iter().copied());
        match (self.format, self.glu, self.activation) {
            (WeightFormat::Mxfp4, GluLayout::Separate, Activation::Situ { beta, linear_beta })
                if k3_order =>
            {
                Some((beta, linear_beta))
            }
            _ => None,
        }
    }

    /// Borrows an expert's span as matrices and biases.
    pub fn view<'a>(&self, bytes: &'a [u8]) -> Result<ExpertView<'a>> {
        let layout = self.layout();
        let (offs, want) = layout.offsets();
        let want = want as usize;
        let at: Vec<(usize, usize)> = offs
            .iter()
            .zip(layout.part_sizes())
            .map(|(&o, n)| (o as usize, n as usize))
            .collect();
        if bytes.len() != want {
            return Err(Error::Mxfp4(format!(
                "expert span has {} bytes, its layout needs {want}",
                bytes.len()
            )));
        }
        let get = |m: Matrix| -> Result<Option<(Weights<'a>, Option<Vec<f32>>)>> {
            let (r, c) = self.matrix_shape(m);
            let w = match self.format {
                WeightFormat::Mxfp4 => {
                    let (Some(p), Some(s)) = (
                        self.part(bytes, &at, m, PartKind::Packed),
                        self.part(bytes, &at, m, PartKind::Scales),
                    ) else {
                        return Ok(None);
                    };
                    Weights::Mxfp4(Mxfp4Matrix::new(p, s, r, c)?)
                }
                WeightFormat::Bf16 => match self.part(bytes, &at, m, PartKind::Weight) {
                    Some(w) => Weights::Dense(DenseMatrix::new(DenseData::Bf16(w), r, c)?),
                    None => return Ok(None),
                },
            };
            let bias = self.part(bytes, &at, m, PartKind::Bias).map(bf16_values);
            Ok(Some((w, bias)))
        };
        let missing = |m: Matrix| Error::Mxfp4(format!("the expert's parts have no {m:?} matrix"));
        let down = get(Matrix::Down)?.ok_or_else(|| missing(Matrix::Down))?;
        let up = match self.glu {
            GluLayout::Separate => {
                let g = get(Matrix::Gate)?.ok_or_else(|| missing(Matrix::Gate))?;
                let u = get(Matrix::Up)?.ok_or_else(|| missing(Matrix::Up))?;
                GateUp::Separate(g, u)
            }
            GluLayout::Interleaved => {
                GateUp::Interleaved(get(Matrix::GateUp)?.ok_or_else(|| missing(Matrix::GateUp))?)
            }
        };
        Ok(ExpertView { up, down })
    }

    /// `ys[t] = expert(zs[t])` for `t` rows of `zs` `[t, width]` → `[t, width]`, on the host
    /// with `opts`' kernels; `parallel` splits each matrix's rows across the rayon pool.
    pub fn forward(
        &self,
        opts: &ExecOptions,
        bytes: &[u8],
        zs: &[f32],
        t: usize,
        parallel: bool,
    ) -> Result<Vec<f32>> {
        let v = self.view(bytes)?;
        let inter = self.inter;
        let mut a = vec![0f32; t * inter];
        match &v.up {
            GateUp::Separate(g, u) => {
                let gs = apply(opts, g, zs, t, parallel)?;
                let us = apply(opts, u, zs, t, parallel)?;
                for ((ai, gi), ui) in a.iter_mut().zip(&gs).zip(&us) {
                    *ai = self.activation.apply(*gi, *ui);
                }
            }
            GateUp::Interleaved(gu) => {
                let h = apply(opts, gu, zs, t, parallel)?; // [t, 2·inter]
                for (ai, pair) in a.iter_mut().zip(h.chunks_exact(2)) {
                    *ai = self.activation.apply(pair[0], pair[1]);
                }
            }
        }
        apply(opts, &v.down, &a, t, parallel)
    }
}

/// A matrix's weights.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// MXFP4.
    Mxfp4(Mxfp4Matrix<'a>),
    /// BF16 (through the dense kernel).
    Dense(DenseMatrix<'a>),
}

/// A matrix and its bias.
pub type WithBias<'a> = (Weights<'a>, Option<Vec<f32>>);

/// Gate and up of one expert.
#[derive(Debug, Clone)]
pub enum GateUp<'a> {
    /// Two matrices.
    Separate(WithBias<'a>, WithBias<'a>),
    /// One interleaved matrix.
    Interleaved(WithBias<'a>),
}

/// An expert's span borrowed as matrices.
#[derive(Debug, Clone)]
pub struct ExpertView<'a> {
    /// Gate and up.
    pub up: GateUp<'a>,
    /// Down.
    pub down: WithBias<'a>,
}

/// `W x + b` for `t` rows.
fn apply(
    opts: &ExecOptions,
    (w, bias): &WithBias<'_>,
    xs: &[f32],
    t: usize,
    parallel: bool,
) -> Result<Vec<f32>> {
    let rows = match w {
        Weights::Mxfp4(m) => m.rows,
        Weights::Dense(m) => m.rows,
    };
    let mut ys = vec![0f32; t * rows];
    match w {
        Weights::Mxfp4(m) => mxfp4::gemm_with(opts.kernel, m, xs, t, &mut ys, parallel)?,
        Weights::Dense(m) => {
            crate::kernels::dense::gemm(&m.with_kernel(opts.dense), xs, t, &mut ys)?
        }
    }
    if let Some(b) = bias {
        for row in ys.chunks_exact_mut(rows.max(1)) {
            for (y, bi) in row.iter_mut().zip(b) {
                *y += bi;
            }
        }
    }
    Ok(ys)
}

/// Little-endian BF16 bytes as f32.
fn bf16_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}
