//! Named access to one layer's tensors: small ones (norms, conv weights, gate parameters) read
//! once at load, matrices borrowed from the layer's spine data at each forward pass.

use candle::{Device, Tensor};

use crate::config::K3Config;
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
