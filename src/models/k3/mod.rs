//! Kimi K3 as Candle modules (spec §3, `docs/k3-spec.md`): the model (`model.rs`), its layers, and
//! its expert names and expert network (`names.rs`), from which the runtime learns K3's experts.

mod as_model;
pub mod attn_res;
pub mod batch;
pub mod config;
pub mod family;
pub mod fixture;
pub mod forward;
pub mod kda;
pub mod kda_kernels;
mod layer;
pub mod load;
pub mod mla;
pub mod mla_cache;
pub mod model;
pub mod moe;
pub mod names;
pub mod ops;
pub mod options;
pub mod train;
pub mod verify;
pub mod weights;

pub use kda::KdaMode;
pub use mla::MlaMode;
pub use model::K3Model;
pub use moe::route;
pub use options::ModelOptions;
