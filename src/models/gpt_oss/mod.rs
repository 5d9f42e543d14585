//! gpt-oss (OpenAI's 20b and 120b MoE models) on the runtime: its config (`config.rs`), YaRN
//! rotary (`rope.rs`), attention with sinks and sliding windows (`attention.rs`), tensor names
//! and expert network (`names.rs`), the model (`model.rs`) and a fixture writer in the hub's
//! exact format (`fixture.rs`). Shares no code with K3 beyond the runtime's public pieces
//! (checkpoint inventory, expert index and store, MoE executor, dense kernels, `SeqState`).

pub mod attention;
pub mod config;
pub mod fixture;
pub mod model;
pub mod names;
pub mod rope;

pub use config::GptOssConfig;
pub use model::GptOssModel;
