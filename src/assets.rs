//! The built-in model, K3-tiny: a small model of K3's exact architecture trained on public-domain
//! English (`deltafin-k3 train`, docs/k3-tiny.md), committed in K3's on-disk format under
//! `assets/k3-tiny/`. `run`, `serve`, `eval` and the chat example use it when no model root is
//! given. Owns only where that directory is.

use std::path::PathBuf;

use crate::{Error, Result};

/// Where the crate's K3-tiny lives (the source tree this library was built from).
pub const K3_TINY_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/k3-tiny");

/// The K3-tiny model directory, checked to hold a config.
pub fn k3_tiny() -> Result<PathBuf> {
    let dir = PathBuf::from(K3_TINY_DIR);
    if dir.join("config.json").is_file() {
        Ok(dir)
    } else {
        Err(Error::Msg(format!(
            "the built-in K3-tiny is missing at {} (a source checkout has it under assets/); pass --model-root",
            dir.display()
        )))
    }
}
