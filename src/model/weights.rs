//! Named access to one layer's tensors: small ones (norms, conv weights, gate parameters) read
//! once at load, matrices borrowed from the layer's spine data at each forward pass.

use candle::{Device, Tensor};

use crate::config::K3Config;
use crate::spine::dense::DenseMatrix;
use crate::spine::layer::LayerData;
use crate::Result;

/// The small tensors of layer `layer`.
pub struct LayerWeights<'a> {
    /// The model config.
    pub cfg: &'a K3Config,
    /// The layer's small tensors (names relative to the layer).
    pub small: &'a LayerData,
    /// Where tensors go.
    pub device: &'a Device,
    /// Layer index.
    pub layer: usize,
}

impl LayerWeights<'_> {
    /// A small tensor as f32 on the device.
    pub fn get(&self, suffix: &str, shape: &[usize]) -> Result<Tensor> {
        self.small.tensor(suffix, shape, self.device)
    }

    /// A small tensor as host f32 values.
    pub fn values(&self, suffix: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.small.values(suffix, shape)
    }
}

/// `x · Wᵀ` for `x` `[.., in]` with a spine matrix `W` `[out, in]`, through the fused kernel.
pub fn dense(x: &Tensor, w: &DenseMatrix) -> Result<Tensor> {
    if let Some(r) = crate::gpu::dense(x, w) {
        return r;
    }
    let dims = x.dims().to_vec();
    let inp = *dims.last().unwrap_or(&0);
    if inp != w.cols {
        return Err(crate::Error::Msg(format!(
            "input width {inp} != matrix columns {}",
            w.cols
        )));
    }
    let t: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let xs = x.flatten_all()?.to_vec1::<f32>()?;
    let mut ys = vec![0f32; t * w.rows];
    crate::spine::dense::gemm(w, &xs, t, &mut ys)?;
    let out = super::ops::with_last_dim(&dims, w.rows);
    Ok(Tensor::from_vec(ys, out, x.device())?)
}
