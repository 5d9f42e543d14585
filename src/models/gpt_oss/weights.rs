//! gpt-oss's dense tensors bound at load: each layer's projections with their biases widened (`Layer`), checked against
//! the config's shapes with errors naming the tensor. Owns no arithmetic.

use crate::checkpoint::Inventory;
use crate::layers::attention::AttnShape;
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::Result;

use super::config::{AttnKind, GptOssConfig};
use super::names;

/// A projection: its matrix and bias.
#[derive(Debug, Clone)]
pub(super) struct Linear {
    pub(super) w: Stored,
    pub(super) b: Vec<f32>,
}

/// One decoder layer's dense tensors.
#[derive(Debug)]
pub(super) struct Layer {
    pub(super) input_norm: Vec<f32>,
    pub(super) post_norm: Vec<f32>,
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) o: Linear,
    pub(super) sinks: Vec<f32>,
    pub(super) router: Linear,
    pub(super) shape: AttnShape,
}

pub(super) fn load_layer(
    inv: &Inventory,
    maps: &Mapped,
    cfg: &GptOssConfig,
    l: usize,
) -> Result<Layer> {
    let h = cfg.hidden_size;
    let (qd, kd) = (
        cfg.num_attention_heads * cfg.head_dim,
        cfg.num_key_value_heads * cfg.head_dim,
    );
    let n = |s: &str| names::layer(l, s);
    let linear = |p: &str, rows: usize, cols: usize| -> Result<Linear> {
        Ok(Linear {
            w: matrix(inv, &n(&format!("{p}.weight")), rows, cols)?,
            b: maps.vector(inv, &n(&format!("{p}.bias")), rows)?,
        })
    };
    Ok(Layer {
        input_norm: maps.vector(inv, &n("input_layernorm.weight"), h)?,
        post_norm: maps.vector(inv, &n("post_attention_layernorm.weight"), h)?,
        q: linear("self_attn.q_proj", qd, h)?,
        k: linear("self_attn.k_proj", kd, h)?,
        v: linear("self_attn.v_proj", kd, h)?,
        o: linear("self_attn.o_proj", h, qd)?,
        sinks: maps.vector(inv, &n("self_attn.sinks"), cfg.num_attention_heads)?,
        router: linear("mlp.router", cfg.num_local_experts, h)?,
        shape: AttnShape {
            heads: cfg.num_attention_heads,
            kv_heads: cfg.num_key_value_heads,
            d: cfg.head_dim,
            window: match cfg.attn_kind(l) {
                AttnKind::Sliding => cfg.sliding_window,
                AttnKind::Full => usize::MAX,
            },
        },
    })
}
