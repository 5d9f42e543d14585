//! gpt-oss's tensor names as the hub's `model-*.safetensors` hold them, and its routed experts
//! described to the runtime: each layer's experts stacked in six tensors
//! (`mlp.experts.gate_up_proj_{blocks,scales,bias}`, `down_proj_{…}`), MXFP4 codes
//! `[E, rows, cols/32, 16]` low nibble first, E8M0 scales `[E, rows, cols/32]`, BF16 biases;
//! gate and up rows interleaved; SwiGLU-OAI (α = 1.702, clamp `swiglu_limit`).

use crate::checkpoint::{ExpertIndex, Inventory};
use crate::moe::{Activation, ExpertFfn, GluLayout, Matrix, Part, PartKind, WeightFormat};
use crate::Result;

use super::config::GptOssConfig;

/// The embedding `[vocab, hidden]`.
pub const EMBED: &str = "model.embed_tokens.weight";
/// The final norm `[hidden]`.
pub const NORM: &str = "model.norm.weight";
/// The output projection `[vocab, hidden]`.
pub const LM_HEAD: &str = "lm_head.weight";

/// The six stacked expert tensors of a layer, in the order of `expert_ffn`'s parts.
pub const EXPERT_PARTS: [&str; 6] = [
    "gate_up_proj_blocks",
    "gate_up_proj_scales",
    "gate_up_proj_bias",
    "down_proj_blocks",
    "down_proj_scales",
    "down_proj_bias",
];

/// Whether `name` is a routed expert's tensor (streamed; never in a streaming install's dense
/// copy).
pub fn is_expert(name: &str) -> bool {
    EXPERT_PARTS
        .iter()
        .any(|p| name.ends_with(&format!("mlp.experts.{p}")))
}

/// Full name of layer `l`'s tensor `suffix`.
pub fn layer(l: usize, suffix: &str) -> String {
    format!("model.layers.{l}.{suffix}")
}

/// gpt-oss's expert network as a runtime value.
pub fn expert_ffn(cfg: &GptOssConfig) -> ExpertFfn {
    let part = |matrix, kind| Part { matrix, kind };
    ExpertFfn {
        format: WeightFormat::Mxfp4,
        width: cfg.hidden_size,
        inter: cfg.intermediate_size,
        glu: GluLayout::Interleaved,
        activation: Activation::SwiGluOai {
            alpha: 1.702,
            limit: cfg.swiglu_limit,
        },
        parts: vec![
            part(Matrix::GateUp, PartKind::Packed),
            part(Matrix::GateUp, PartKind::Scales),
            part(Matrix::GateUp, PartKind::Bias),
            part(Matrix::Down, PartKind::Packed),
            part(Matrix::Down, PartKind::Scales),
            part(Matrix::Down, PartKind::Bias),
        ],
    }
}

/// Every routed expert's span (each layer's experts are stacked, so one request per part).
pub fn expert_index(inv: &Inventory, cfg: &GptOssConfig) -> Result<ExpertIndex> {
    let n = cfg.num_hidden_layers;
    let layers: Vec<usize> = (0..n).collect();
    ExpertIndex::derive_stacked(
        inv,
        n,
        &layers,
        cfg.num_local_experts,
        expert_ffn(cfg).layout(),
        |l, p| layer(l, &format!("mlp.experts.{}", EXPERT_PARTS[p])),
    )
}
