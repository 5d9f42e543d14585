//! One layer's weights at load: small tensors (norms, conv weights, gate parameters) read once
//! into a `candle_nn::VarBuilder` (each `get` checks the shape the config asks for), and each
//! matrix bound to its place in the layer's layout (`Slot`), so a forward pass takes it from the
//! layer's spine data by position.

use std::collections::HashMap;

use candle::{DType, Device, Tensor};
use candle_nn::VarBuilder;

use crate::models::k3::config::K3Config;
use crate::spine::layer::{Entry, LayerData};
use crate::spine::slot::{bind, Slot};
use crate::{Error, Result};

/// The tensors of `data` as f32 on `device`, in a `VarBuilder` (names as in `data`).
pub fn var_builder(data: &LayerData, device: &Device) -> Result<VarBuilder<'static>> {
    let mut map = HashMap::new();
    for e in data.layout() {
        map.insert(e.name.clone(), data.tensor(&e.name, &e.shape, device)?);
    }
    Ok(VarBuilder::from_tensors(map, DType::F32, device))
}

/// The small tensors of layer `layer`.
pub struct LayerWeights<'a> {
    /// The model config.
    pub cfg: &'a K3Config,
    /// The layer's small tensors (names relative to the layer).
    pub small: VarBuilder<'a>,
    /// The whole layer's layout, as each pass hands it over (what matrices are bound to).
    pub layout: &'a [Entry],
    /// Layer index.
    pub layer: usize,
}

impl LayerWeights<'_> {
    /// A small tensor as f32 on the device, with the shape the config asks for.
    pub fn get(&self, suffix: &str, shape: &[usize]) -> Result<Tensor> {
        self.small.get(shape, suffix).map_err(|e| Error::Tensor {
            name: format!("layer {} {suffix}", self.layer),
            msg: e.to_string(),
        })
    }

    /// Binds a `[rows, cols]` matrix of the layer, checking it is there with that shape.
    pub fn slot(&self, name: &str, rows: usize, cols: usize) -> Result<Slot> {
        bind(self.layout, name, rows, cols)
    }

    /// KDA's `A_log` as `heads` per-head values: the first `heads` entries of the stored vector
    /// (K3 pads it with zeros to `head_dim`); a shorter or multi-dimensional tensor is an error
    /// naming it. Non-zero padding is ignored here, as the reference ignores it (`doctor` says so).
    pub fn a_log(&self, heads: usize) -> Result<Vec<f32>> {
        let name = "self_attn.A_log";
        let stored = self
            .layout
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.shape.clone());
        let bad = |msg: String| Error::Tensor {
            name: format!("layer {} {name}", self.layer),
            msg,
        };
        let shape = stored.ok_or_else(|| bad("missing from the checkpoint".into()))?;
        let len: usize = shape.iter().product();
        if shape.iter().filter(|&&n| n != 1).count() > 1 || len < heads {
            return Err(bad(format!(
                "shape {shape:?}: expected one value per KDA head ({heads}), optionally \
                 zero-padded (K3 stores [head_dim])"
            )));
        }
        let mut v = self.values(name, &shape)?;
        v.truncate(heads);
        Ok(v)
    }

    /// A small tensor as host f32 values.
    pub fn values(&self, suffix: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.get(suffix, shape)?.flatten_all()?.to_vec1()?)
    }
}
