//! Kimi K3 on Candle: a streaming MoE runtime.
//!
//! The crate is organised as DESIGN.md describes: `config` (K3Config), `checkpoint`
//! (safetensors headers, the tensor inventory, expert spans, fixture writers) and `mxfp4`
//! (MXFP4 format and fused kernels).
//!
//! ```no_run
//! use deltafin::{checkpoint::{ExpertIndex, Inventory}, K3Config};
//! # fn main() -> deltafin::Result<()> {
//! let dir = std::path::Path::new("/tmp/k3-nano");
//! deltafin::checkpoint::fixture::write_nano(dir, &Default::default())?;
//! let cfg = K3Config::from_file(&dir.join("config.json"))?;
//! let inv = Inventory::from_dir(dir)?;
//! let experts = ExpertIndex::derive_k3(&inv, &cfg)?;
//! println!("{} tensors, {} experts", inv.len(), experts.count());
//! # Ok(()) }
//! ```

#![recursion_limit = "256"]

pub mod bench;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod error;
pub mod experts;
pub mod generate;
pub mod model;
pub mod mxfp4;
pub mod progress;
pub mod spine;

pub use config::K3Config;
pub use error::{Error, Result};
pub use experts::ExpertProvider;
pub use generate::{GenerateOptions, Generation, Generator};
pub use model::{K3Model, SeqState};
pub use spine::SpineSource;
