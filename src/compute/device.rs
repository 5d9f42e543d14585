//! Choosing the compute device once, at startup (`--device`), and naming it in reports.

use candle::Device;

use crate::{Error, Result};

/// Which device runs the spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
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
