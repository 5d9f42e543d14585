//! MXFP4 weights as a Candle op, in the style of Candle's `QTensor`: the op holds the packed
//! bytes and scales; `matvec(&x, &w)` maps `[.., cols]` f32 to `[.., rows]` f32.

use std::sync::Arc;

use candle::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::format::Mxfp4Matrix;
use super::kernels::Kernel;

/// An owned MXFP4 matrix `[rows, cols]` (packed codes + E8M0 scales).
#[derive(Debug, Clone)]
pub struct Mxfp4Weights {
    packed: Arc<[u8]>,
    scales: Arc<[u8]>,
    rows: usize,
    cols: usize,
    kernel: Kernel,
    /// The bytes uploaded to a Metal device (once per device).
    #[cfg(feature = "metal")]
    uploaded: Arc<super::metal::Uploaded>,
}

impl Mxfp4Weights {
    /// Wraps packed `[rows, cols/2]` and scales `[rows, cols/32]`, checking sizes.
    pub fn new(
        packed: impl Into<Arc<[u8]>>,
        scales: impl Into<Arc<[u8]>>,
        rows: usize,
        cols: usize,
    ) -> crate::Result<Self> {
        let (packed, scales) = (packed.into(), scales.into());
        Mxfp4Matrix::new(&packed, &scales, rows, cols)?;
        Ok(Mxfp4Weights {
            packed,
            scales,
            rows,
            cols,
            kernel: Kernel::best(),
            #[cfg(feature = "metal")]
            uploaded: Default::default(),
        })
    }

    /// Uses a specific kernel (for tests and benchmarks).
    pub fn with_kernel(mut self, kernel: Kernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// A borrowed view.
    pub fn matrix(&self) -> Mxfp4Matrix<'_> {
        Mxfp4Matrix {
            packed: &self.packed,
            scales: &self.scales,
            rows: self.rows,
            cols: self.cols,
        }
    }

    /// The dequantised matrix as an f32 tensor (reference path).
    pub fn dequantize(&self, device: &candle::Device) -> candle::Result<Tensor> {
        Tensor::from_vec(
            super::format::dequantize(&self.matrix()),
            (self.rows, self.cols),
            device,
        )
    }
}

impl CustomOp1 for Mxfp4Weights {
    fn name(&self) -> &'static str {
        "mxfp4-matvec"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle::Result<(CpuStorage, Shape)> {
        use candle::backend::BackendStorage;
        let io = matvec_io(
            "mxfp4 matvec",
            storage.dtype(),
            layout,
            self.cols,
            self.rows,
        )?;
        let x = &storage.as_slice::<f32>()?[io.start..io.start + io.tokens * self.cols];
        let mut y = vec![0f32; io.tokens * self.rows];
        super::gemm_with(self.kernel, &self.matrix(), x, io.tokens, &mut y, true)
            .map_err(|e| candle::Error::Msg(e.to_string()))?;
        Ok((CpuStorage::F32(y), io.shape))
    }

    #[cfg(feature = "metal")]
    fn metal_fwd(
        &self,
        storage: &candle::MetalStorage,
        layout: &Layout,
    ) -> candle::Result<(candle::MetalStorage, Shape)> {
        super::metal::mxfp4_matvec(self, &self.uploaded, storage, layout)
    }
}

/// `W x` over the last dimension of `x` (f32, any leading dims).
pub fn matvec(x: &Tensor, w: &Mxfp4Weights) -> candle::Result<Tensor> {
    x.contiguous()?.apply_op1_no_bwd(w)
}

/// `dims` with the last dimension set to `n`: the shape of `x · Wᵀ` for `W` with `n` rows.
pub fn with_last_dim(dims: &[usize], n: usize) -> Vec<usize> {
    let mut out = dims.to_vec();
    if let Some(l) = out.last_mut() {
        *l = n;
    }
    out
}

/// What a matrix-vector custom op needs of its input `[.., cols]` (f32, contiguous).
pub struct MatvecIo {
    /// First element of the input in its storage.
    pub start: usize,
    /// Input rows (product of the leading dimensions).
    pub tokens: usize,
    /// Output shape `[.., rows]`.
    pub shape: Shape,
}

/// Checks a matvec op's input (`op` names the op in errors) and derives its `MatvecIo`.
pub fn matvec_io(
    op: &str,
    dtype: DType,
    layout: &Layout,
    cols: usize,
    rows: usize,
) -> candle::Result<MatvecIo> {
    if dtype != DType::F32 {
        candle::bail!("{op}: input must be f32, got {dtype:?}");
    }
    let Some((start, end)) = layout.contiguous_offsets() else {
        candle::bail!("{op}: input must be contiguous");
    };
    let dims = layout.shape().dims();
    if dims.last().copied() != Some(cols) {
        candle::bail!("{op}: input {dims:?} does not end in {cols} columns");
    }
    Ok(MatvecIo {
        start,
        tokens: (end - start).checked_div(cols).unwrap_or(0),
        shape: Shape::from(with_last_dim(dims, rows)),
    })
}
