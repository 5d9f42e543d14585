//! The template layers on Metal: one shared-storage buffer per layer kind (KDA-shaped and
//! MLA-shaped), allocated once and grown only if a larger layer of that kind arrives; each
//! streamed layer's bytes are copied into its kind's template. Pinned layers (and the tail with
//! lm_head) get their own device copy once, at load.

use std::sync::{Arc, Mutex};

use candle::MetalDevice;
use candle_metal_kernels::metal::Buffer;

use crate::kernels::dense::DeviceRef;
use crate::shaders::{shared_buffer, write_shared};
use crate::spine::layer::LayerData;
use crate::spine::DeviceSide;
use crate::{Error, Result};

/// A layer's bytes on the device (the spine holds it as an opaque `DeviceCopy`).
struct DeviceLayer {
    buffer: Arc<Buffer>,
}

/// Where a matrix's bytes lie on the device.
#[derive(Clone, Copy)]
pub struct DeviceView<'a> {
    pub(crate) buffer: &'a Buffer,
    pub(crate) data: usize,
    pub(crate) scales: usize,
}

impl<'a> DeviceView<'a> {
    /// The view of a matrix in its layer's device copy (made by `SpineDevice`).
    pub fn of(at: &DeviceRef<'a>) -> Result<Self> {
        let layer = at
            .copy
            .downcast_ref::<DeviceLayer>()
            .ok_or_else(|| err("a layer's device copy was not made by the Metal spine device"))?;
        Ok(DeviceView {
            buffer: &layer.buffer,
            data: at.data,
            scales: at.scales,
        })
    }
}

impl std::fmt::Debug for DeviceView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceView(data @{}, scales @{})",
            self.data, self.scales
        )
    }
}

/// The spine's device side: the two template layers.
pub struct SpineDevice {
    device: MetalDevice,
    /// Index 0: KDA-shaped layers, 1: MLA-shaped layers.
    templates: Mutex<[Option<Arc<Buffer>>; 2]>,
}

fn err(e: impl std::fmt::Display) -> Error {
    Error::Msg(format!("metal spine: {e}"))
}

impl SpineDevice {
    /// The spine's side on `device`, with no template allocated yet.
    pub fn new(device: MetalDevice) -> Self {
        SpineDevice {
            device,
            templates: Mutex::new([None, None]),
        }
    }
}

impl DeviceSide for SpineDevice {
    /// Gives a pinned layer its own device copy (made once; never re-read).
    fn pin(&self, layer: &mut LayerData) -> Result<()> {
        let buffer = shared_buffer(&self.device, layer.raw().len())?;
        write_shared(&buffer, 0, layer.raw())?;
        layer.attach_device(Box::new(DeviceLayer { buffer }));
        Ok(())
    }

    /// Copies a streamed layer into the template of its kind.
    fn upload(&self, layer: &mut LayerData) -> Result<()> {
        let kind = usize::from(layer.has("self_attn.kv_b_proj.weight"));
        let len = layer.raw().len();
        let mut t = self.templates.lock().map_err(err)?;
        // The template may still be read by the previous layer of this kind: wait for the
        // queued GPU work before overwriting it (host write-after-read is not tracked).
        self.device.wait_until_completed()?;
        if t[kind].as_ref().is_none_or(|b| b.length() < len) {
            if let Some(old) = t[kind].take() {
                self.device.unregister_buffers([&*old]);
            }
            tracing::debug!(kind, len, "allocating a template layer on the GPU");
            t[kind] = Some(shared_buffer(&self.device, len)?);
        }
        let buffer = t[kind]
            .clone()
            .ok_or_else(|| err("template not allocated"))?;
        write_shared(&buffer, 0, layer.raw())?;
        layer.attach_device(Box::new(DeviceLayer { buffer }));
        Ok(())
    }
}
