//! gpt-oss under the runtime's one `MemoryPlan`: its `RowShape` (the charges are the row-cache
//! family's, `layers::plan`): one key/value row of `2·kv_heads·head_dim` floats per position
//! and layer, six-part MXFP4 experts, and the activations one position of a prefill pass holds.

use crate::checkpoint::Inventory;
use crate::layers::plan::RowShape;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::MemoryPlan;
use crate::Result;

use super::config::GptOssConfig;
use super::names;

/// Bytes one routed expert occupies (its six parts).
pub fn expert_bytes(cfg: &GptOssConfig) -> u64 {
    names::expert_ffn(cfg).layout().span_bytes()
}

/// Floats of activations one position of a prefill pass holds at once.
fn row_floats(cfg: &GptOssConfig) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let qd = (cfg.num_attention_heads * cfg.head_dim) as u64;
    let kd = (cfg.num_key_value_heads * cfg.head_dim) as u64;
    let k = cfg.top_k() as u64;
    // x, its norm, q, k, v, attention out, o; router logits; each selected expert's
    // gate/up and output, and the combined rows.
    4 * h + 3 * qd + 2 * kd + cfg.num_local_experts as u64 + k * (2 * i + h) + h
}

/// gpt-oss's shape for the plan.
pub fn shape(cfg: &GptOssConfig) -> RowShape {
    RowShape {
        family: "gpt-oss",
        layers: cfg.num_hidden_layers,
        row_width: 2 * cfg.num_key_value_heads * cfg.head_dim,
        vocab: cfg.vocab_size,
        expert_bytes: expert_bytes(cfg),
        row_floats: row_floats(cfg),
        max_context: cfg.max_position_embeddings,
        lm_head: names::LM_HEAD.into(),
        norm: names::NORM.into(),
    }
}

/// The plan for `cfg` with the dense tensors `inv` lists.
pub fn plan(cfg: &GptOssConfig, inv: &Inventory, o: &LoadOptions) -> Result<MemoryPlan> {
    crate::layers::plan::plan(&shape(cfg), inv, o)
}
