//! The spine's settings (`SpineOptions`, `SpineChoice`): what `Spine::open` is asked for.
//! Holds no state and reads no file; `source.rs` acts on them.

use std::sync::Arc;

/// Which spine to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineChoice {
    /// Row-int8 store if converted, else the BF16 store, else the shards.
    Auto,
    /// The original weights (BF16 store or the shards).
    Bf16,
    /// The row-int8 store (an error if it was not converted).
    Int8,
}

/// Spine settings.
#[derive(Clone)]
pub struct SpineOptions {
    /// Format choice.
    pub choice: SpineChoice,
    /// Bytes of layers to pin, whole layers in order (`None`: pin everything).
    pub resident_bytes: Option<u64>,
    /// Exactly which layers to pin (the memory plan's choice); wins over `resident_bytes`.
    pub pin: Option<Vec<bool>>,
    /// Streamed layers in flight (2 = double buffering; 1 = each read in the model's thread
    /// when it asks for it, after the previous one is dropped).
    pub in_flight: usize,
    /// The compute device's side (template layers, pinned copies), from
    /// `compute::spine_device`; `None`: the host kernels read the host bytes.
    pub device_side: Option<Arc<dyn super::DeviceSide>>,
    /// Read streamed store layers with parallel `O_DIRECT` requests (for a page cache that
    /// cannot hold them; the engine decides from the memory plan).
    pub direct: bool,
    /// The arithmetic of the layers' matrices on the host.
    pub dense: crate::kernels::dense::DenseKernel,
    /// Streamed layers are mapped from the store for the pass instead of read into buffers
    /// (one at a time; the page cache holds a few matrices of the layer, not all of it): for a
    /// memory budget below one layer. Needs the spine store (an error on the shards).
    pub mapped: bool,
}

impl std::fmt::Debug for SpineOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpineOptions")
            .field("choice", &self.choice)
            .field("resident_bytes", &self.resident_bytes)
            .field("pin", &self.pin)
            .field("in_flight", &self.in_flight)
            .field("device_side", &self.device_side.is_some())
            .field("direct", &self.direct)
            .field("dense", &self.dense)
            .field("mapped", &self.mapped)
            .finish()
    }
}

impl Default for SpineOptions {
    fn default() -> Self {
        SpineOptions {
            choice: SpineChoice::Auto,
            resident_bytes: None,
            pin: None,
            in_flight: 2,
            device_side: None,
            direct: false,
            dense: Default::default(),
            mapped: false,
        }
    }
}
