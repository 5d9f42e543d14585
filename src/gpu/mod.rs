//! Compute-device selection and the device side of the spine and experts.
//!
//! The model is device-generic Candle; only three things have device-specific code, all in
//! `gpu::metal` behind the `metal` feature: the spine matrices' GEMV (BF16, F32, row-int8) reading
//! the template layers, the fused MXFP4 expert dispatch, and the template layers themselves.
//! Without the feature every type here is uninhabited and every hook returns `None`, so the CPU
//! build carries no Metal code.

use candle::Device;

use crate::{Error, Result};

#[cfg(feature = "metal")]
pub mod metal;

/// Which device runs the spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DeviceChoice {
    /// Metal when compiled in (`--features metal`) and a GPU exists, else the CPU.
    #[default]
    Auto,
    /// The CPU.
    Cpu,
    /// Apple's Metal GPU (needs `--features metal`).
    Metal,
}

/// Whether this build has the Metal path compiled in.
pub const METAL_COMPILED: bool = cfg!(feature = "metal");

/// Opens the chosen device.
pub fn select(choice: DeviceChoice) -> Result<Device> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Metal if !METAL_COMPILED => Err(Error::Msg(
            "--device metal: this binary was built without Metal; rebuild with \
             `cargo build --release --features metal` on a Mac"
                .into(),
        )),
        DeviceChoice::Metal => Device::new_metal(0).map_err(|e| {
            Error::Msg(format!(
                "--device metal: no Metal device could be opened ({e}); use --device cpu"
            ))
        }),
        DeviceChoice::Auto if METAL_COMPILED => Ok(Device::new_metal(0).unwrap_or(Device::Cpu)),
        DeviceChoice::Auto => Ok(Device::Cpu),
    }
}

/// A short name for logs and reports.
pub fn describe(device: &Device) -> &'static str {
    if device.is_metal() {
        "metal"
    } else if device.is_cuda() {
        "cuda"
    } else {
        "cpu"
    }
}

#[cfg(feature = "metal")]
pub use metal::{DeviceLayer, DeviceView, SpineDevice};

/// A layer's bytes on the device (uninhabited: built without Metal).
#[cfg(not(feature = "metal"))]
pub enum DeviceLayer {}

/// Where a matrix's bytes lie on the device (uninhabited: built without Metal).
#[cfg(not(feature = "metal"))]
#[derive(Debug, Clone, Copy)]
pub enum DeviceView<'a> {
    #[doc(hidden)]
    Never(std::convert::Infallible, std::marker::PhantomData<&'a ()>),
}

/// The spine's device side: template layers and pinned copies (uninhabited without Metal).
#[cfg(not(feature = "metal"))]
pub enum SpineDevice {}

#[cfg(not(feature = "metal"))]
impl DeviceLayer {
    /// The view of the tensor at `offset` (and its row scales at `scale_offset`).
    pub fn view(&self, _offset: usize, _scale_offset: usize) -> DeviceView<'_> {
        match *self {}
    }
}

#[cfg(not(feature = "metal"))]
impl SpineDevice {
    /// The device side for `device`, or `None` when it needs none (the CPU).
    pub fn new(_device: &Device) -> Result<Option<Self>> {
        Ok(None)
    }

    /// Gives a pinned layer its own device copy.
    pub fn pin(&self, _layer: &mut crate::spine::layer::LayerData) -> Result<()> {
        match *self {}
    }

    /// Copies a streamed layer into its template slot.
    pub fn upload(&self, _layer: &mut crate::spine::layer::LayerData) -> Result<()> {
        match *self {}
    }
}

/// `x · Wᵀ` on the device holding `w`'s bytes, or `None` to use the host kernel.
pub fn dense(
    x: &candle::Tensor,
    w: &crate::spine::dense::DenseMatrix,
) -> Option<Result<candle::Tensor>> {
    #[cfg(feature = "metal")]
    {
        let v = w.device?;
        x.device().is_metal().then(|| metal::dense(x, w, &v))
    }
    #[cfg(not(feature = "metal"))]
    {
        let _ = (x, w);
        None
    }
}

/// One MoE layer's selected experts on the device, or `None` to run them on the host: pair
/// `(k, t)` runs expert span `spans[k]` on latent row `t` of `z` (pairs of one expert
/// consecutive); returns `[pairs, latent]`.
pub fn run_experts(
    device: &Device,
    spans: &[crate::experts::ExpertBytes],
    pairs: &[(usize, usize)],
    z: &[f32],
    (inter, latent): (usize, usize),
    (beta, linear_beta): (f32, f32),
) -> Option<Result<Vec<f32>>> {
    match device {
        #[cfg(feature = "metal")]
        Device::Metal(d) => Some(metal::run_experts(
            d,
            spans,
            pairs,
            z,
            inter,
            latent,
            beta,
            linear_beta,
        )),
        _ => {
            let _ = (spans, pairs, z, inter, latent, beta, linear_beta);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_always_available() {
        assert!(select(DeviceChoice::Cpu).unwrap().is_cpu());
        assert_eq!(describe(&Device::Cpu), "cpu");
    }

    #[test]
    fn metal_without_the_feature_names_the_fix() {
        if METAL_COMPILED {
            return;
        }
        let e = select(DeviceChoice::Metal).unwrap_err().to_string();
        assert!(e.contains("--features metal"), "{e}");
        assert!(select(DeviceChoice::Auto).unwrap().is_cpu());
    }
}
