//! `Qwen3MoeConfig`: Qwen3-MoE's config.json as the hub publishes it (`model_type:
//! "qwen3_moe"`: Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-480B-A35B), validated, with
//! which layers are sparse (`decoder_sparse_step`, `mlp_only_layers`, as transformers decides
//! it). Defaults are transformers' `Qwen3MoeConfig`'s where the hub's files may omit a field.
//! Reads no other file.

use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

fn one() -> usize {
    1
}
fn eps() -> f64 {
    1e-6
}
fn theta() -> f64 {
    10_000.0
}
fn silu() -> String {
    "silu".into()
}

/// Qwen3-MoE's config.json (the fields the forward pass reads; others are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Qwen3MoeConfig {
    /// `qwen3_moe`.
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Width of a dense MLP layer (`mlp_only_layers`).
    #[serde(default)]
    pub intermediate_size: usize,
    /// Width of one routed expert.
    pub moe_intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads.
    pub num_key_value_heads: usize,
    /// Head width (`hidden_size / num_attention_heads` when absent).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Renormalise the top-k router probabilities to sum 1.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Every `decoder_sparse_step`-th layer is sparse.
    #[serde(default = "one")]
    pub decoder_sparse_step: usize,
    /// Layers with a dense MLP regardless of the step.
    #[serde(default)]
    pub mlp_only_layers: Vec<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    /// Rotary base.
    #[serde(default = "theta")]
    pub rope_theta: f64,
    /// Rotary scaling (none implemented: must be null).
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Positions the model was trained for.
    pub max_position_embeddings: usize,
    /// lm_head is the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Biased q/k/v/o projections (none published; must be false).
    #[serde(default)]
    pub attention_bias: bool,
    /// Sliding-window attention (none published; must be false).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// The MLP activation (`silu`).
    #[serde(default = "silu")]
    pub hidden_act: String,
    /// The ids that end a reply (one or a list).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

impl Qwen3MoeConfig {
    /// Reads and validates `path`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let c: Qwen3MoeConfig = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
            path: path.to_path_buf(),
            source: e,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Whether layer `l` routes to experts (transformers' rule: not in `mlp_only_layers`, and
    /// `(l + 1) % decoder_sparse_step == 0`).
    pub fn is_moe(&self, l: usize) -> bool {
        !self.mlp_only_layers.contains(&l)
            && self.num_experts > 0
            && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// The sparse layers.
    pub fn moe_layers(&self) -> Vec<usize> {
        (0..self.num_hidden_layers)
            .filter(|&l| self.is_moe(l))
            .collect()
    }

    /// Every rule the forward pass relies on, each failure naming the field.
    pub fn validate(&self) -> Result<()> {
        Error::rule(self.model_type == "qwen3_moe", "model_type", || {
            format!("`{}` is not qwen3_moe", self.model_type)
        })?;
        for (f, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("moe_intermediate_size", self.moe_intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim()),
            ("num_experts", self.num_experts),
            ("num_experts_per_tok", self.num_experts_per_tok),
            ("decoder_sparse_step", self.decoder_sparse_step),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            Error::rule(v > 0, f, || "must be > 0".into())?;
        }
        Error::rule(
            self.num_attention_heads
                .is_multiple_of(self.num_key_value_heads),
            "num_key_value_heads",
            || {
                format!(
                    "{} query heads are not a multiple of {} key/value heads",
                    self.num_attention_heads, self.num_key_value_heads
                )
            },
        )?;
        Error::rule(self.head_dim().is_multiple_of(2), "head_dim", || {
            "must be even (rotary pairs)".into()
        })?;
        Error::rule(
            self.num_experts_per_tok <= self.num_experts,
            "num_experts_per_tok",
            || {
                format!(
                    "{} exceeds num_experts {}",
                    self.num_experts_per_tok, self.num_experts
                )
            },
        )?;
        let dense = self.num_hidden_layers - self.moe_layers().len();
        Error::rule(
            dense == 0 || self.intermediate_size > 0,
            "intermediate_size",
            || format!("{dense} dense MLP layers need intermediate_size > 0"),
        )?;
        Error::rule(self.hidden_act == "silu", "hidden_act", || {
            format!("`{}`: only silu is implemented", self.hidden_act)
        })?;
        Error::rule(!self.attention_bias, "attention_bias", || {
            "biased attention projections are not implemented (no published Qwen3-MoE has them)"
                .into()
        })?;
        Error::rule(!self.use_sliding_window, "use_sliding_window", || {
            "sliding-window attention is not implemented".into()
        })?;
        Error::rule(
            self.rope_scaling.as_ref().is_none_or(|v| v.is_null()),
            "rope_scaling",
            || {
                "rotary scaling (YaRN) is not implemented for Qwen3-MoE yet; remove it to run within the trained context".into()
            },
        )?;
        self.eos_ids().map(|_| ())
    }

    /// The ids that end a reply (`eos_token_id`, one or several).
    pub fn eos_ids(&self) -> Result<Vec<u32>> {
        crate::runtime::family::eos_ids(self.eos_token_id.as_ref(), self.vocab_size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3-30B-A3B's published config.json.
    pub(crate) const QWEN3_30B_A3B: &str = r#"{
      "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
      "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
      "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
      "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 48,
      "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
      "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
      "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
      "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
      "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
      "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 151936}"#;

    #[test]
    fn the_published_config_reads_and_every_layer_is_sparse() {
        let c: Qwen3MoeConfig = serde_json::from_str(QWEN3_30B_A3B).unwrap();
        c.validate().unwrap();
        assert_eq!(c.head_dim(), 128);
        assert_eq!(c.moe_layers().len(), 48);
        assert_eq!(c.eos_ids().unwrap(), vec![151645]);
    }

    #[test]
    fn sparse_step_and_mlp_only_layers_pick_the_dense_layers() {
        let mut c: Qwen3MoeConfig = serde_json::from_str(QWEN3_30B_A3B).unwrap();
        c.decoder_sparse_step = 2;
        c.mlp_only_layers = vec![3];
        assert!(!c.is_moe(0) && c.is_moe(1) && !c.is_moe(3) && c.is_moe(5));
        c.intermediate_size = 0;
        assert!(c.validate().is_err(), "dense layers need intermediate_size");
    }

    #[test]
    fn unsupported_fields_are_refused_by_name() {
        for (field, edit) in [
            (
                "rope_scaling",
                r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
            ),
            ("attention_bias", r#""attention_bias": true"#),
            ("hidden_act", r#""hidden_act": "gelu""#),
            ("use_sliding_window", r#""use_sliding_window": true"#),
        ] {
            let key = edit.split(':').next().unwrap();
            let start = QWEN3_30B_A3B.find(key).unwrap();
            let end = start + QWEN3_30B_A3B[start..].find(", \"").unwrap();
            let text = format!("{}{edit}{}", &QWEN3_30B_A3B[..start], &QWEN3_30B_A3B[end..]);
            let c: Qwen3MoeConfig = serde_json::from_str(&text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }
}
