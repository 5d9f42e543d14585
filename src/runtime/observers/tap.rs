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
    /// Most rows kept per layer between `take`s (the oldest go first).
    max_rows: usize,
}

impl HiddenTap {
    /// A tap on `layers` (0-based decoder layers; the rows after each).
    pub fn new(layers: &[usize]) -> Self {
        HiddenTap {
            layers: layers.to_vec(),
            got: Mutex::new(Vec::new()),
            pass_first: Mutex::new(0),
            max_rows: usize::MAX,
        }
    }

    /// A tap that keeps at most the `max_rows` most recent rows per layer between `take`s
    /// (a drafter not asked for drafts for a while must not hold every row of a long
    /// generation); `Tapped::first` counts the dropped ones.
    pub fn with_limit(layers: &[usize], max_rows: usize) -> Self {
        HiddenTap {
            max_rows: max_rows.max(1),
            ..Self::new(layers)
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
        let rows = match event {
            Event::PassStart { first_pos, .. } => {
                if let Ok(mut f) = self.pass_first.lock() {
                    *f = *first_pos;
                }
                return;
            }
            Event::LayerDone(rows) => rows,
            _ => return,
        };
        let Ok(mut got) = self.got.lock() else { return };
        if !self.layers.contains(&layer) {
            return;
        }
        let v = match rows.to_f32() {
            Ok(v) => v,
            Err(e) => return tracing::warn!("hidden tap: layer {layer}: {e}"),
        };
        let first = self.pass_first.lock().map_or(0, |f| *f);
        let at = match got.iter().position(|t| t.layer == layer) {
            Some(at) => {
                got[at].rows.extend(v);
                at
            }
            None => {
                let at = got.partition_point(|t| t.layer < layer);
                let width = rows.width();
                got.insert(
                    at,
                    Tapped {
                        layer,
                        width,
                        first,
                        rows: v,
                    },
                );
                at
            }
        };
        let t = &mut got[at];
        let held = t.rows.len() / t.width.max(1);
        if held > self.max_rows {
            let drop = held - self.max_rows;
            t.rows.drain(..drop * t.width);
            t.first += drop;
        }
    }
}
