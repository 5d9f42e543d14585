//! `HiddenTap`: an observer that keeps the hidden rows of chosen layers from the last pass, the
//! input a drafter that reads the target's hidden states (EAGLE-3) takes, and what `logits
//! --hidden-layers` reports. Works on every model that reports `Event::LayerDone` (every
//! registered family). Owns the copies; never changes a pass.

use std::sync::Mutex;

use crate::runtime::observe::{Event, Observer};

/// One tapped layer's rows from the last pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Tapped {
    /// The layer.
    pub layer: usize,
    /// Values per row (the hidden size).
    pub width: usize,
    /// The sequence position of the first row.
    pub first: usize,
    /// `T * width` values, row-major, one row per position.
    pub rows: Vec<f32>,
}

/// Keeps the rows of `layers` from every pass since the last `take`, appended per layer in
/// position order (a prefill split into several passes, layer-major or not, gives each layer's
/// rows whole).
#[derive(Debug, Default)]
pub struct HiddenTap {
    layers: Vec<usize>,
    got: Mutex<Vec<Tapped>>,
    /// The first position of the pass under way.
    pass_first: Mutex<usize>,
}

impl HiddenTap {
    /// A tap on `layers` (0-based decoder layers; the rows after each).
    pub fn new(layers: &[usize]) -> Self {
        HiddenTap {
            layers: layers.to_vec(),
            got: Mutex::new(Vec::new()),
            pass_first: Mutex::new(0),
        }
    }

    /// The rows since the last `take`, by layer (a layer the model does not have is absent).
    pub fn take(&self) -> Vec<Tapped> {
        self.got
            .lock()
            .map(|mut g| std::mem::take(&mut *g))
            .unwrap_or_default()
    }
}

impl Observer for HiddenTap {
    fn on(&self, layer: usize, event: &Event<'_>) {
        let Ok(mut got) = self.got.lock() else { return };
        let Event::LayerDone(rows) = event else {
            return;
        };
        if !self.layers.contains(&layer) {
            return;
        }
        let v = match rows.to_f32() {
            Ok(v) => v,
            Err(e) => return tracing::warn!("hidden tap: layer {layer}: {e}"),
        };
        match got.iter_mut().find(|t| t.layer == layer) {
            Some(t) => t.rows.extend(v),
            None => {
                let at = got.partition_point(|t| t.layer < layer);
                got.insert(
                    at,
                    Tapped {
                        layer,
                        width: rows.width(),
                        first: self.pass_first.lock().map_or(0, |f| *f),
                        rows: v,
                    },
                );
            }
        }
    }
}
