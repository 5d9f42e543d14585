//! One layer's weights at load: small tensors (norms, conv weights, gate parameters) read once,
//! and each matrix bound to its place in the layer's layout (`Slot`), so a forward pass takes it
//! from the layer's spine data by position.

use candle::{Device, Tensor};

use crate::config::K3Config;
use crate::spine::layer::{Entry, LayerData};
use crate::spine::slot::{bind, Slot};
use crate::Result;

/// The small tensors of layer `layer`.
pub struct LayerWeights<'a> {
    /// The model config.
    pub cfg: &'a K3Config,
    /// The layer's small tensors (names relative to the layer).
    pub small: &'a LayerData,
    /// The whole layer's layout, as each pass hands it over (what matrices are bound to).
    pub layout: &'a [Entry],
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

    /// Binds a `[rows, cols]` matrix of the layer, checking it is there with that shape.
    pub fn slot(&self, name: &str, rows: usize, cols: usize) -> Result<Slot> {
        bind(self.layout, name, rows, cols)
    }

    /// A small tensor as host f32 values.
    pub fn values(&self, suffix: &str, shape: &[usize]) -> Result<Vec<f32>> {
        self.small.values(suffix, shape)
    }
}
