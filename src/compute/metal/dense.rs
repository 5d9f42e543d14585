//! Spine matrices on Metal: `x · Wᵀ` with `W` read in place from a template layer (or a pinned
//! layer's device copy) by the BF16 / F32 / row-int8 GEMV shaders. Row-int8 is dequantised in
//! registers (int8 × f16 row scale, fp32 accumulate); no fp32 copy of a matrix is written.

use candle::backend::BackendStorage;
use candle::{CpuStorage, CustomOp1, DType, Layout, MetalStorage, Shape, Tensor};
use candle_metal_kernels::metal::ComputeCommandEncoder;
use candle_metal_kernels::set_params;
use candle_metal_kernels::utils::{Input, Output};

use super::spine::DeviceView;
use crate::kernels::dense::DeviceRef;
use crate::kernels::dense::{DenseData, DenseMatrix};

/// The GEMV of one spine matrix whose bytes are on the device ("weights live in the op, the
/// activations are the tensor", as Candle's `QTensor`).
pub struct DenseOp<'a> {
    view: DeviceView<'a>,
    kind: Kind,
    rows: usize,
    cols: usize,
}

#[derive(Clone, Copy)]
enum Kind {
    F32,
    Bf16,
    I8,
}

impl<'a> DenseOp<'a> {
    /// The op for `w`, whose bytes lie at `view`.
    pub fn new(w: &DenseMatrix, view: DeviceView<'a>) -> Self {
        let kind = match w.data {
            DenseData::F32(_) => Kind::F32,
            DenseData::Bf16(_) => Kind::Bf16,
            DenseData::I8 { .. } => Kind::I8,
        };
        DenseOp {
            view,
            kind,
            rows: w.rows,
            cols: w.cols,
        }
    }
}

impl CustomOp1 for DenseOp<'_> {
    fn name(&self) -> &'static str {
        "deltafin-dense"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle::Result<(CpuStorage, Shape)> {
        candle::bail!("deltafin-dense: the device GEMV was given a CPU tensor")
    }

    fn metal_fwd(
        &self,
        storage: &MetalStorage,
        layout: &Layout,
    ) -> candle::Result<(MetalStorage, Shape)> {
        let device = storage.device();
        let io = crate::mxfp4::matvec_io(
            "deltafin-dense",
            storage.dtype(),
            layout,
            self.cols,
            self.rows,
        )?;
        let (start, tokens) = (io.start, io.tokens);
        let n = tokens * self.rows;
        let output = device
            .new_buffer_builder()
            .with_size_for(n, DType::F32)
            .with_label("deltafin-dense")
            .build()?;
        if n > 0 {
            // Host-side work (library, pipeline) before the encoder guard is taken.
            let k = crate::shaders::kernels(device)?;
            let name = match self.kind {
                Kind::F32 => "f32_gemv",
                Kind::Bf16 => "bf16_gemv",
                Kind::I8 => "int8_gemv",
            };
            let pipeline = k.pipeline(device, name)?;
            let (groups, per_group) = crate::shaders::linear_split(&pipeline, n);
            let (rows, cols, t) = (self.rows as u32, self.cols as u32, tokens as u32);
            let w = Input::with_offset(self.view.buffer, self.view.data);
            let x = Input::with_offset(storage.buffer(), start * DType::F32.size_in_bytes());
            let encoder = device.command_encoder()?;
            encoder.set_label("deltafin-dense");
            let enc: &ComputeCommandEncoder = encoder.as_ref();
            enc.set_compute_pipeline_state(&pipeline);
            match self.kind {
                Kind::I8 => {
                    let s = Input::with_offset(self.view.buffer, self.view.scales);
                    set_params!(enc, (w, s, x, Output::new(&output), rows, cols, t));
                }
                Kind::F32 | Kind::Bf16 => {
                    set_params!(enc, (w, x, Output::new(&output), rows, cols, t));
                }
            }
            enc.dispatch_thread_groups(groups, per_group);
        }
        Ok((
            MetalStorage::new(output, device.clone(), n, DType::F32),
            io.shape,
        ))
    }
}

/// `x · Wᵀ` for `x` on a Metal device and `W`'s bytes at `at` in its layer's device copy.
pub fn dense(x: &Tensor, w: &DenseMatrix, at: &DeviceRef) -> crate::Result<Tensor> {
    let view = DeviceView::of(at)?;
    Ok(x.contiguous()?.apply_op1_no_bwd(&DenseOp::new(w, view))?)
}
