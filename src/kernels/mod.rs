//! Host kernels that read weights in their stored form, never copied to an fp32 matrix: the
//! dense BF16 / F32 / row-int8 GEMV and GEMM (`dense`: the matrices and the reference
//! arithmetic; `dense_gemm`: the driver; `dense_x86` / `dense_neon`: the SIMD twins;
//! `dense_fma`: the fused x86-64 kernel), and the same as a Candle op on the host
//! (`HostDense`), so a projection reads its input tensor in place. The MXFP4 kernels are
//! `crate::mxfp4`; the Metal kernels are `crate::compute::metal` and `crate::shaders`. Owns no
//! weights: a matrix borrows its bytes from whoever holds them (a spine layer, an expert).

pub mod dense;
#[cfg(target_arch = "x86_64")]
mod dense_fma;
mod dense_gemm;
#[cfg(target_arch = "aarch64")]
mod dense_neon;
#[cfg(target_arch = "x86_64")]
mod dense_x86;
pub mod dense_xtw;

use candle::{CpuStorage, CustomOp1, Layout, Shape};

use dense::DenseMatrix;

/// `x · Wᵀ` for a dense matrix on the host as a Candle op: the input's storage is read in place
/// (no copy out of the tensor) and the output vector becomes the result's storage.
pub struct HostDense<'a>(pub &'a DenseMatrix<'a>);

impl CustomOp1 for HostDense<'_> {
    fn name(&self) -> &'static str {
        "deltafin-host-dense"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle::Result<(CpuStorage, Shape)> {
        use candle::backend::BackendStorage;
        let w = self.0;
        let io = crate::mxfp4::matvec_io("dense", storage.dtype(), layout, w.cols, w.rows)?;
        let x = &storage.as_slice::<f32>()?[io.start..io.start + io.tokens * w.cols];
        let mut y = vec![0f32; io.tokens * w.rows];
        dense::gemm(w, x, io.tokens, &mut y).map_err(|e| candle::Error::Msg(e.to_string()))?;
        Ok((CpuStorage::F32(y), io.shape))
    }
}
