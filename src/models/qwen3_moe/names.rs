//! Qwen3-MoE's tensor names as the hub's `model-*.safetensors` hold them, and its routed
//! experts described to the runtime: one BF16 tensor per expert and matrix
//! (`model.layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight`, `[inter, hidden]`,
//! `[inter, hidden]`, `[hidden, inter]`), gate and up separate, SiLU. The hub cuts its shards at
//! tensor boundaries, so an expert's three tensors may lie in two files (the index records each
//! part's shard).

use crate::checkpoint::{ExpertIndex, Inventory};
use crate::moe::{Activation, ExpertFfn, GluLayout, Matrix, Part, PartKind, WeightFormat};
use crate::Result;

use super::config::Qwen3MoeConfig;

/// The embedding `[vocab, hidden]`.
pub const EMBED: &str = "model.embed_tokens.weight";
/// The final norm `[hidden]`.
pub const NORM: &str = "model.norm.weight";
/// The output projection `[vocab, hidden]` (absent with tied embeddings).
pub const LM_HEAD: &str = "lm_head.weight";

/// An expert's three matrices, in the order of `expert_ffn`'s parts.
pub const EXPERT_MATRICES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Full name of layer `l`'s tensor `suffix`.
pub fn layer(l: usize, suffix: &str) -> String {
    format!("model.layers.{l}.{suffix}")
}

/// Expert `e` of layer `l`, matrix `m` (`gate_proj`, `up_proj`, `down_proj`).
pub fn expert(l: usize, e: usize, m: &str) -> String {
    layer(l, &format!("mlp.experts.{e}.{m}.weight"))
}

/// Whether `name` is a routed expert's tensor (streamed; never in a streaming install's dense
/// copy).
pub fn is_expert(name: &str) -> bool {
    name.contains(".mlp.experts.")
}

/// Qwen3-MoE's expert network as a runtime value.
pub fn expert_ffn(cfg: &Qwen3MoeConfig) -> ExpertFfn {
    let part = |matrix| Part {
        matrix,
        kind: PartKind::Weight,
    };
    ExpertFfn {
        format: WeightFormat::Bf16,
        width: cfg.hidden_size,
        inter: cfg.moe_intermediate_size,
        glu: GluLayout::Separate,
        activation: Activation::Silu,
        parts: vec![part(Matrix::Gate), part(Matrix::Up), part(Matrix::Down)],
    }
}

/// Every routed expert's span (one request per part; a part may lie in another shard).
pub fn expert_index(inv: &Inventory, cfg: &Qwen3MoeConfig) -> Result<ExpertIndex> {
    ExpertIndex::derive(
        inv,
        cfg.num_hidden_layers,
        &cfg.moe_layers(),
        cfg.num_experts,
        expert_ffn(cfg).layout(),
        |l, e, p| expert(l, e, EXPERT_MATRICES[p]),
    )
}
