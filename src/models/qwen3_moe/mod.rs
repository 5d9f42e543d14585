//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B) on the runtime, the third
//! family and the proof that one lands as a folder plus a line in `models::FAMILIES`: its
//! config (`config.rs`), tensor names and BF16 expert network (`names.rs`), weights bound at
//! load (`weights.rs`), the model (`model.rs`) and its layer (`pass.rs`: q/k-normed
//! grouped-query attention, softmax top-k routing with `norm_topk_prob`), its answers to the
//! runtime (`as_model.rs`), memory plan shape (`plan.rs`), registration (`family.rs`) and a
//! fixture writer in the hub's layout (`fixture.rs`). Everything else is the runtime's shared
//! pieces: mapped dense tensors, RMSNorm, rotary, attention and the row-cache model
//! (`layers`), the expert index and store, the MoE executor, ChatML (`chat::chatml`).
//!
//! ```
//! use deltafin::models::qwen3_moe::fixture::{write_qwen3_moe, Qwen3MoeShape};
//! use deltafin::models::qwen3_moe::Qwen3MoeModel;
//! use deltafin::runtime::load::LoadOptions;
//!
//! # fn main() -> deltafin::Result<()> {
//! let dir = tempfile::tempdir().map_err(|e| deltafin::Error::io("tempdir", e))?;
//! write_qwen3_moe(dir.path(), &Qwen3MoeShape::tiny(), 0, 3)?;
//! let model = Qwen3MoeModel::open_planned(dir.path(), &LoadOptions::default(), |plan| {
//!     println!("{plan}")
//! })?;
//! let mut state = model.new_state();
//! let mut logits = model.forward(&[1, 2, 3, 4], &mut state)?; // prefill: last position
//! for _ in 0..8 {
//!     let next = deltafin::runtime::generate::argmax(&logits);
//!     logits = model.forward(&[next], &mut state)?; // experts read as the router picks them
//! }
//! assert_eq!(state.pos, 12);
//! # Ok(())
//! # }
//! ```

mod as_model;
pub mod config;
pub mod family;
pub mod fixture;
pub mod model;
pub mod names;
mod pass;
pub mod plan;
mod weights;

pub use config::Qwen3MoeConfig;
pub use model::Qwen3MoeModel;
