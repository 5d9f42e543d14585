//! The model-agnostic MoE runtime: routing (`Gating`), the routed expert as a value
//! (`ExpertFfn`: MXFP4 or BF16, per-matrix biases, separate or interleaved gate/up, SiTU,
//! SwiGLU-OAI or SiLU), and the executor (`RoutedExperts`: group rows by expert, fetch each
//! once from an `ExpertProvider` as the reads arrive, run, combine in top-k order). A model
//! supplies its router logits and its expert description; nothing here names a tensor of any
//! model. K3's latent MoE (`model::moe`) is one user; `tests/moe_reuse.rs` builds gpt-oss- and
//! Qwen3-MoE-shaped blocks from this API alone.

pub mod device;
mod executor;
mod ffn;
mod gating;

pub use executor::{ExecOptions, RoutedExperts};
pub use ffn::{
    Activation, ExpertFfn, ExpertView, GateUp, GluLayout, Matrix, Part, PartKind, WeightFormat,
    Weights, WithBias,
};
pub use gating::{Gating, Route};
