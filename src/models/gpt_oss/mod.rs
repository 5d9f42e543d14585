//! gpt-oss (OpenAI's 20b and 120b MoE models) on the runtime: its config (`config.rs`), YaRN
//! rotary (`rope.rs`), attention with sinks and sliding windows (`layers::attention`), tensor names
//! and expert network (`names.rs`), the model (`model.rs`; its layer loop over one or several
//! sequences in `pass.rs`) and a fixture writer in the hub's
//! exact format (`fixture.rs`). Shares no code with K3 beyond the runtime's public pieces
//! (checkpoint inventory, expert index and store, MoE executor, dense kernels, `SeqState`).
//!
//! Opening gpt-oss with streamed experts (here the tiny fixture; a hub checkpoint directory is
//! opened the same way):
//!
//! ```
//! use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
//! use deltafin::models::gpt_oss::GptOssModel;
//! use deltafin::runtime::load::LoadOptions;
//!
//! # fn main() -> deltafin::Result<()> {
//! let dir = tempfile::tempdir().map_err(|e| deltafin::Error::io("tempdir", e))?;
//! write_gpt_oss(dir.path(), &GptOssShape::tiny(), 0, 3)?;
//! // The memory plan sizes the expert RAM tier, prefetch and context; the experts stream
//! // from the shards through the tiered store, the dense layers are mapped.
//! let model = GptOssModel::open_planned(dir.path(), &LoadOptions::default(), |plan| {
//!     println!("{plan}")
//! })?;
//! let mut state = model.new_state();
//! let mut logits = model.forward(&[1, 2, 3, 4], &mut state)?; // prefill: last position
//! let mut ids = Vec::new();
//! for _ in 0..8 {
//!     let next = deltafin::runtime::generate::argmax(&logits);
//!     ids.push(next);
//!     logits = model.forward(&[next], &mut state)?; // one step
//! }
//! assert_eq!(state.pos, 12);
//! # Ok(())
//! # }
//! ```

mod as_model;
pub mod config;
pub mod family;
pub mod fixture;
mod fixture_tokenizer;
pub mod model;
pub mod names;
mod pass;
pub mod plan;
pub mod rope;
pub mod tokenizer;
mod weights;

pub use config::GptOssConfig;
pub use model::GptOssModel;
