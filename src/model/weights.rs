//! Named access to one layer's spine tensors.

use candle::Tensor;

use crate::config::K3Config;
use crate::spine::SpineSource;
use crate::Result;

/// The tensors of layer `layer`, read through a `SpineSource`.
pub struct LayerWeights<'a> {
    /// The model config.
    pub cfg: &'a K3Config,
    /// Where tensors come from.
    pub spine: &'a dyn SpineSource,
    /// Name prefix (`language_model.` for K3).
    pub prefix: &'a str,
    /// Layer index.
    pub layer: usize,
}

impl LayerWeights<'_> {
    /// Full name of a per-layer tensor.
    pub fn name(&self, suffix: &str) -> String {
        format!("{}model.layers.{}.{suffix}", self.prefix, self.layer)
    }

    /// Loads `suffix` with the expected shape.
    pub fn get(&self, suffix: &str, shape: &[usize]) -> Result<Tensor> {
        self.spine.tensor(&self.name(suffix), shape)
    }
}
