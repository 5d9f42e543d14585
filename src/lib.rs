//! A streaming Mixture-of-Experts runtime on Candle, built for Kimi K3 and open to any MoE
//! family: the dense spine pinned or streamed layer by layer, the routed experts read as the
//! router picks them (RAM tier, disk cache, shards, hub range requests), MXFP4 and BF16 kernels.
//!
//! The crate's map is `docs/ARCHITECTURE.md`; using it as a library is `docs/library.md`; K3's
//! contract, cited as "spec §N", is `docs/k3-spec.md`. Modules, top down: `engine` (the front
//! door: `Engine`, `Session`, the batch scheduler, the prompt cache), `install` (setup from the
//! hub), `server` (OpenAI-compatible HTTP, feature `server`), `eval` (the quality harness),
//! `models` (one folder per family and their list, `models::FAMILIES`), `runtime` (the `Model`
//! and `ModelFamily` contracts, the sequence state, observers, the decoding loop, the memory
//! plan), `installed` (an install's manifest and expert store), `moe` (gating, the expert as a
//! value, the executor), `compute` (the device seam), `spine` (dense weights), `experts` (the
//! tiered expert store), `mxfp4` and `kernels` (fused kernels and their Candle ops),
//! `checkpoint` (safetensors headers, the inventory, expert spans), `layers` (what families with
//! key/value rows share), `drafters` (EAGLE-3, DFlash and DSpark heads), `hub`, `chat`,
//! `tokenizer`, `measure` (bounds measured in the same run), `training` (what trainers share),
//! `fsio`, `progress`, `alloc_count`, `error` and `assets` (the built-in K3-tiny). Runnable
//! examples: below, and in `experts` (the tiered store) and `mxfp4` (the fused kernel and its
//! Candle op); `examples/stream_moe.rs` streams a model no family covers.
//!
//! The front door is an [`Engine`] (one loaded model under the memory plan) and its
//! [`Session`]s (one conversation each; a turn feeds only what is new). On K3-tiny, the
//! built-in model (K3's architecture and format, trained small on public-domain English):
//!
//! ```
//! use std::sync::atomic::AtomicBool;
//! use deltafin::chat::{ChatOptions, Delta, Message};
//! use deltafin::{Engine, EngineOptions, GenerateOptions};
//! # fn main() -> deltafin::Result<()> {
//! let root = deltafin::assets::k3_tiny()?;
//! let engine = Engine::open(&root, &EngineOptions::default())?;
//! let mut session = engine.session(ChatOptions::default());
//! let opts = GenerateOptions { max_new: 8, stop_ids: vec![engine.eos()], ..Default::default() };
//! let cancel = AtomicBool::new(false);
//! for question in ["Hello!", "What is 2+2?"] {
//!     let turn = session.chat_turn(
//!         &[Message::new("user", question)],
//!         &opts,
//!         &cancel,
//!         &mut |logits: &[f32]| deltafin::runtime::generate::argmax(logits),
//!         |delta| if let Delta::Content(text) = delta { print!("{text}") },
//!     )?;
//!     println!("\n({} tokens fed, {} generated)", turn.generation.prompt_ids.len(),
//!         turn.generation.generated_ids.len());
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
#![recursion_limit = "256"]

pub mod alloc_count;
pub mod assets;
pub mod chat;
pub mod checkpoint;
pub mod compute;
pub mod drafters;
pub mod engine;
pub mod error;
pub mod eval;
pub mod experts;
pub mod fsio;
pub mod hub;
pub mod install;
pub mod installed;
pub mod kernels;
pub mod layers;
pub mod measure;
pub mod models;
pub mod moe;
pub mod mxfp4;
pub mod progress;
pub mod runtime;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "metal")]
mod shaders;
pub mod spine;
pub mod tokenizer;
pub mod training;

/// The README's Rust example, compiled and run as a doc test so the front page cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

// The front door, at the root: what the README's library example uses.
pub use engine::{ChatTurn, Engine, EngineOptions, Session, SessionSnapshot};
pub use error::{Error, Result};
pub use experts::ExpertProvider;
pub use runtime::generate::{GenerateOptions, Generation, Generator, StopReason};
pub use runtime::model::Model;

/// Process set-up for the binaries, the chat example and anything that runs a model: the
/// thread count (`init_threads`) and an allocator that returns large buffers to the OS
/// (`runtime::memory::bound_allocator`). `threads_set`: whether the caller's environment already sets
/// `RAYON_NUM_THREADS` (the library reads no environment). Call it first thing in `main`,
/// before any thread starts.
pub fn init(threads_set: bool) {
    if !threads_set {
        init_threads();
    }
    runtime::memory::bound_allocator();
}

/// Pins Candle's and rayon's thread count (`RAYON_NUM_THREADS`) to the available parallelism.
/// Call it first thing in `main`, before any thread starts, when the variable is unset: Candle
/// 0.11 on Linux otherwise re-reads `/proc/cpuinfo` on every CPU matmul, which made K3-nano
/// decode 5x slower.
pub fn init_threads() {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    // SAFETY-relevant note: called before other threads exist, as documented above.
    std::env::set_var("RAYON_NUM_THREADS", n.to_string());
}
