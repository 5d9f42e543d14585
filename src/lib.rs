//! Kimi K3 on Candle: a streaming MoE runtime.
//!
//! The crate is organised as DESIGN.md describes: `config` (K3Config), `checkpoint`
//! (safetensors headers, the tensor inventory, expert spans, fixture writers), `mxfp4` (MXFP4
//! format and fused kernels), `model` (K3 as Candle modules), `spine` (dense weights: store,
//! row-int8, pinned/streamed layers), `experts` (the tiered streaming expert store), `hub`
//! (hf-hub range fetches and a mock hub), `tokenizer` and `chat` (K3's BPE and chat format),
//! `generate` (greedy/sampled decoding), `install` (setup from the hub) and `server`
//! (OpenAI-compatible HTTP).
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

pub mod alloc_count;
pub mod atomic;
pub mod bench;
pub mod chat;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod engine;
pub mod error;
pub mod experts;
pub mod generate;
pub mod gpu;
pub mod hub;
pub mod install;
pub mod memory;
pub mod model;
pub mod mxfp4;
pub mod progress;
pub mod server;
pub mod spine;
pub mod tokenizer;

pub use config::K3Config;
pub use engine::{ChatTurn, Engine, EngineOptions, Session, SessionSnapshot};
pub use error::{Error, Result};
pub use experts::ExpertProvider;
pub use generate::{GenerateOptions, Generation, Generator, StopReason};
pub use model::{K3Model, SeqState};
pub use spine::source::Spine;

/// Pins Candle's and rayon's thread count (`RAYON_NUM_THREADS`) to the available parallelism
/// when it is unset. Call it first thing in `main`, before any thread starts: Candle 0.11 on Linux
/// otherwise re-reads `/proc/cpuinfo` on every CPU matmul, which made K3-nano decode 5x slower.
pub fn init_threads() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        // SAFETY-relevant note: called before other threads exist, as documented above.
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}
