//! K3's routed-expert tensor names and layout: the one place the expert store learns how K3
//! names its experts (`ExpertIndex::derive_k3`). The store itself takes names as values.

use crate::checkpoint::{DenseNames, ExpertIndex, ExpertLayout, Inventory};
use crate::models::k3::config::K3Config;
use crate::moe::{Activation, ExpertFfn, GluLayout, Matrix, Part, PartKind, WeightFormat};
use crate::Result;

/// Names of the six parts in canonical (raw-v1) order.
pub const K3_EXPERT_PARTS: [&str; 6] = [
    "w1.weight_packed",
    "w1.weight_scale",
    "w2.weight_packed",
    "w2.weight_scale",
    "w3.weight_packed",
    "w3.weight_scale",
];

/// K3's expert tensor name.
pub fn k3_expert_name(inv: &Inventory, layer: usize, expert: usize, part: &str) -> String {
    inv.layer_name(layer, &format!("block_sparse_moe.experts.{expert}.{part}"))
}

/// K3's routed expert: MXFP4 w1 (gate), w2 (down), w3 (up), no biases, SiTU, running in the
/// latent space (`routed_expert_hidden_size` wide).
pub fn k3_expert_ffn(cfg: &K3Config) -> ExpertFfn {
    let t = cfg.text();
    let part = |matrix, kind| Part { matrix, kind };
    ExpertFfn {
        format: WeightFormat::Mxfp4,
        width: t.routed_expert_hidden_size,
        inter: t.moe_intermediate_size,
        glu: GluLayout::Separate,
        activation: Activation::Situ {
            beta: t.activation_situ_beta as f32,
            linear_beta: t.activation_situ_linear_beta as f32,
        },
        parts: vec![
            part(Matrix::Gate, PartKind::Packed),
            part(Matrix::Gate, PartKind::Scales),
            part(Matrix::Down, PartKind::Packed),
            part(Matrix::Down, PartKind::Scales),
            part(Matrix::Up, PartKind::Packed),
            part(Matrix::Up, PartKind::Scales),
        ],
    }
}

impl ExpertLayout {
    /// K3's layout from the config.
    pub fn k3(cfg: &K3Config) -> Self {
        k3_expert_ffn(cfg).layout()
    }
}

impl ExpertIndex {
    /// Derives K3's expert spans from the inventory, checking every part against the config.
    pub fn derive_k3(inv: &Inventory, cfg: &K3Config) -> Result<Self> {
        let layers: Vec<usize> = cfg.moe_layers().collect();
        Self::derive(
            inv,
            cfg.num_layers(),
            &layers,
            cfg.text().num_experts,
            ExpertLayout::k3(cfg),
            |l, e, p| k3_expert_name(inv, l, e, K3_EXPERT_PARTS[p]),
        )
    }
}

/// K3's dense names: the `language_model.` wrapper (K3 is multimodal), the vision tower
/// skipped, the embedding, the tail (final norm, output AttnRes, lm_head), and what row-int8
/// keeps in BF16 (spec §5 item 2).
pub fn k3_dense_names() -> DenseNames {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    DenseNames {
        wrappers: s(&["language_model."]),
        skipped: s(&["vision_tower.", "mm_projector."]),
        embedding: "model.embed_tokens.weight".into(),
        tail: s(&[
            "model.norm.weight",
            "model.output_attn_res_norm.weight",
            "model.output_attn_res_proj.weight",
            "lm_head.weight",
        ]),
        keep_bf16: s(&[
            "conv1d",
            "norm",
            "A_log",
            "dt_bias",
            "res_proj",
            "e_score_correction_bias",
            ".experts.",
            "vision",
            "mm_projector",
        ]),
    }
}

/// The stores' default names are K3's (the first model; others set theirs on the inventory).
impl Default for DenseNames {
    fn default() -> Self {
        k3_dense_names()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k3_layout_is_the_configs_span() {
        let json = crate::models::k3::fixture::nano_config(1000).to_string();
        let cfg = K3Config::from_json(&json).unwrap();
        let l = ExpertLayout::k3(&cfg);
        assert_eq!(l.span_bytes() as usize, cfg.expert_span_bytes());
        assert_eq!(l.part_shapes.len(), 6);
    }
}
