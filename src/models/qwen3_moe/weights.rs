//! Qwen3-MoE's dense tensors bound at load: each layer's attention projections (no biases),
//! per-head q/k RMSNorm weights, norms, and either its router (a sparse layer) or its dense
//! MLP (`mlp_only_layers`, `decoder_sparse_step`), checked against the config's shapes with
//! errors naming the tensor. Owns no arithmetic.

use crate::checkpoint::Inventory;
use crate::layers::attention::AttnShape;
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::Result;

use super::config::Qwen3MoeConfig;
use super::names;

/// A layer's feed-forward half.
#[derive(Debug)]
pub(super) enum Mlp {
    /// Routed experts: the router `[experts, hidden]`.
    Moe {
        /// `mlp.gate.weight`.
        router: Stored,
    },
    /// A dense SwiGLU MLP of `intermediate_size`.
    Dense {
        /// `[inter, hidden]`.
        gate: Stored,
        /// `[inter, hidden]`.
        up: Stored,
        /// `[hidden, inter]`.
        down: Stored,
    },
}

/// One decoder layer's dense tensors.
#[derive(Debug)]
pub(super) struct Layer {
    pub(super) input_norm: Vec<f32>,
    pub(super) post_norm: Vec<f32>,
    pub(super) q: Stored,
    pub(super) k: Stored,
    pub(super) v: Stored,
    pub(super) o: Stored,
    /// RMSNorm weights `[head_dim]` applied to each query head before rotation.
    pub(super) q_norm: Vec<f32>,
    /// The same for each key head.
    pub(super) k_norm: Vec<f32>,
    pub(super) mlp: Mlp,
    pub(super) shape: AttnShape,
}

pub(super) fn load_layer(
    inv: &Inventory,
    maps: &Mapped,
    cfg: &Qwen3MoeConfig,
    l: usize,
) -> Result<Layer> {
    let (h, d) = (cfg.hidden_size, cfg.head_dim());
    let (qd, kd) = (cfg.num_attention_heads * d, cfg.num_key_value_heads * d);
    let n = |s: &str| names::layer(l, s);
    let m = |s: &str, rows, cols| matrix(inv, &n(s), rows, cols);
    let mlp = match cfg.is_moe(l) {
        true => Mlp::Moe {
            router: m("mlp.gate.weight", cfg.num_experts, h)?,
        },
        false => {
            let i = cfg.intermediate_size;
            Mlp::Dense {
                gate: m("mlp.gate_proj.weight", i, h)?,
                up: m("mlp.up_proj.weight", i, h)?,
                down: m("mlp.down_proj.weight", h, i)?,
            }
        }
    };
    Ok(Layer {
        input_norm: maps.vector(inv, &n("input_layernorm.weight"), h)?,
        post_norm: maps.vector(inv, &n("post_attention_layernorm.weight"), h)?,
        q: m("self_attn.q_proj.weight", qd, h)?,
        k: m("self_attn.k_proj.weight", kd, h)?,
        v: m("self_attn.v_proj.weight", kd, h)?,
        o: m("self_attn.o_proj.weight", h, qd)?,
        q_norm: maps.vector(inv, &n("self_attn.q_norm.weight"), d)?,
        k_norm: maps.vector(inv, &n("self_attn.k_norm.weight"), d)?,
        mlp,
        shape: AttnShape {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            d,
            window: usize::MAX,
        },
    })
}
