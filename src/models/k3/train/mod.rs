//! Training a small model of K3's exact architecture in Candle (`deltafin train`): the
//! differentiable network (`net`), its parameters as K3 tensors (`params`), the token stream
//! (`data`), the loop with checkpoints (`run`) and the export to K3's on-disk format (`export`).
//! K3-tiny, the embedded default model, is made by this module. It reads the inference code's
//! config, chat renderer and tokenizer, and never the inference modules' weights or state.

pub mod data;
pub mod export;
pub mod net;
pub mod params;
pub mod run;

pub use net::Net;
pub use run::run_config;
pub use run::{heldout_nll, train, TrainOptions, TrainReport};

use crate::models::k3::fixture::k3_style_config;

/// The dimensions of a trained K3-architecture model (every structural feature of K3 kept).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Dims {
    /// Hidden size.
    pub hidden: usize,
    /// Layers (layer 0 dense; MLA where `l % 4 == 3` and the last, as K3's rule).
    pub layers: usize,
    /// Dense MLP width of layer 0.
    pub intermediate: usize,
    /// Routed experts per MoE layer.
    pub experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Routed expert FFN width (a multiple of 32).
    pub moe_inter: usize,
    /// Latent width of the routed experts (a multiple of 32).
    pub latent: usize,
    /// Attention heads (KDA and MLA).
    pub heads: usize,
    /// KDA head width.
    pub head_dim: usize,
    /// AttnRes block size (layers per block).
    pub block: usize,
}

impl Dims {
    /// K3-tiny's dimensions.
    pub const TINY: Dims = Dims {
        hidden: 128,
        layers: 6,
        intermediate: 384,
        experts: 8,
        top_k: 2,
        moe_inter: 128,
        latent: 64,
        heads: 4,
        head_dim: 32,
        block: 2,
    };
}

/// The config.json of a model with dimensions `d` and `first_special` BPE ranks.
pub fn config_json(d: &Dims, first_special: u32) -> serde_json::Value {
    let vocab = first_special as usize + crate::checkpoint::tiktoken_fixture::NUM_SPECIALS as usize;
    k3_style_config(
        d.hidden,
        d.layers,
        vocab,
        d.intermediate,
        d.experts,
        d.top_k,
        d.moe_inter,
        d.latent,
        // MLA: heads, q_lora, kv_lora, nope, rope, v.
        (
            d.heads,
            d.hidden / 2,
            d.hidden / 4,
            d.head_dim,
            d.head_dim / 2,
            d.head_dim,
        ),
        (d.heads, d.head_dim),
        d.block,
        first_special,
    )
}
