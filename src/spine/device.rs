//! The spine's seam to a compute device. The spine holds bytes; a device that wants its own copy
//! of a layer (Metal's template layers and pinned copies) implements `DeviceSide`, which
//! `compute` creates and the spine only calls. The copy it attaches is opaque here (`DeviceCopy`):
//! only `compute` knows what is inside and reads it back through a matrix's `DeviceRef`
//! (`kernels::dense`). This
//! module must not name any device type: `compute` depends on `spine`, never the reverse.

use std::any::Any;

use super::layer::LayerData;
use crate::Result;

/// A layer's bytes on a compute device: made and read by `compute`, opaque to the spine.
pub type DeviceCopy = Box<dyn Any + Send + Sync>;

/// A compute device's side of the spine (made by `compute::spine_device`).
pub trait DeviceSide: Send + Sync {
    /// Gives a pinned layer (or the tail) its own device copy, once; it is never re-read.
    fn pin(&self, layer: &mut LayerData) -> Result<()>;
    /// Copies a streamed layer into the device's template for its kind.
    fn upload(&self, layer: &mut LayerData) -> Result<()>;
}
