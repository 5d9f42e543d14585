//! Qwen3-MoE under the runtime's one `MemoryPlan`: its `RowShape` (the charges are the
//! row-cache family's, `layers::plan`): one key/value row of `2·kv_heads·head_dim` floats per
//! position and layer, three-matrix BF16 experts, and the activations one position of a
//! prefill pass holds.

use crate::layers::plan::RowShape;

use super::config::Qwen3MoeConfig;
use super::names;

/// Bytes one routed expert occupies (its three BF16 matrices).
pub fn expert_bytes(cfg: &Qwen3MoeConfig) -> u64 {
    names::expert_ffn(cfg).layout().span_bytes()
}

/// Floats of activations one position of a prefill pass holds at once.
fn row_floats(cfg: &Qwen3MoeConfig) -> u64 {
    let h = cfg.hidden_size as u64;
    let i = cfg.moe_intermediate_size.max(cfg.intermediate_size) as u64;
    let d = cfg.head_dim() as u64;
    let (qd, kd) = (
        cfg.num_attention_heads as u64 * d,
        cfg.num_key_value_heads as u64 * d,
    );
    let k = cfg.num_experts_per_tok as u64;
    // x, its norm, q (and its norm), k, v, attention out, o; router logits; each selected
    // expert's gate, up and output, and the combined rows.
    4 * h + 3 * qd + 3 * kd + cfg.num_experts as u64 + k * (2 * i + h) + h
}

/// Qwen3-MoE's shape for the plan.
pub fn shape(cfg: &Qwen3MoeConfig) -> RowShape {
    RowShape {
        family: "Qwen3-MoE",
        layers: cfg.num_hidden_layers,
        row_width: 2 * cfg.num_key_value_heads * cfg.head_dim(),
        vocab: cfg.vocab_size,
        expert_bytes: expert_bytes(cfg),
        row_floats: row_floats(cfg),
        max_context: cfg.max_position_embeddings,
        lm_head: match cfg.tie_word_embeddings {
            true => names::EMBED.into(),
            false => names::LM_HEAD.into(),
        },
        norm: names::NORM.into(),
    }
}
