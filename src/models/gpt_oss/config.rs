//! `GptOssConfig`: gpt-oss's config.json as the hub publishes it (`model_type: "gpt_oss"`),
//! validated, with each layer's attention kind and the YaRN rotary parameters. Reads no other
//! file.

use std::path::Path;

use serde::Deserialize;

use crate::{Error, Result};

/// `rope_scaling`: YaRN (gpt-oss's only scaling).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RopeScaling {
    /// `yarn`.
    pub rope_type: String,
    /// Context extension factor (32).
    pub factor: f64,
    /// Rotations at which extrapolation stops (32).
    #[serde(default = "beta_fast")]
    pub beta_fast: f64,
    /// Rotations at which interpolation starts (1).
    #[serde(default = "beta_slow")]
    pub beta_slow: f64,
    /// The pre-training context (4,096).
    pub original_max_position_embeddings: usize,
    /// Whether the correction range is rounded to whole dimensions (false for gpt-oss).
    #[serde(default = "default_true")]
    pub truncate: bool,
}

fn beta_fast() -> f64 {
    32.0
}
fn beta_slow() -> f64 {
    1.0
}
fn default_true() -> bool {
    true
}
fn swiglu_limit() -> f32 {
    7.0
}
fn sliding_window() -> usize {
    128
}

/// `quantization_config` of the published checkpoint (`quant_method: "mxfp4"`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QuantConfig {
    /// `mxfp4`.
    pub quant_method: String,
}

/// The fields of config.json the model reads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct GptOssConfig {
    /// `gpt_oss`.
    pub model_type: String,
    /// Residual width (2,880).
    pub hidden_size: usize,
    /// Expert FFN width (2,880).
    pub intermediate_size: usize,
    /// Decoder layers (24 or 36).
    pub num_hidden_layers: usize,
    /// Query heads (64).
    pub num_attention_heads: usize,
    /// Key/value heads (8).
    pub num_key_value_heads: usize,
    /// Head width (64).
    pub head_dim: usize,
    /// Routed experts per layer (32 or 128).
    pub num_local_experts: usize,
    /// Top-k (4).
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// Top-k as OpenAI's own config spells it (the published config has both).
    #[serde(default)]
    pub experts_per_token: Option<usize>,
    /// Vocabulary (201,088).
    pub vocab_size: usize,
    /// RMSNorm epsilon (1e-5).
    pub rms_norm_eps: f64,
    /// Positions a sliding layer sees, the current one included (128).
    #[serde(default = "sliding_window")]
    pub sliding_window: usize,
    /// Rotary base (150,000).
    pub rope_theta: f64,
    /// YaRN.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// `sliding_attention` / `full_attention` per layer (alternating when absent).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// SwiGLU clamp (7).
    #[serde(default = "swiglu_limit")]
    pub swiglu_limit: f32,
    /// Longest context (131,072).
    pub max_position_embeddings: usize,
    /// Whether lm_head is the embedding (false for gpt-oss).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v/o carry biases (true).
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    /// End-of-turn ids (`<|return|>` 200002 in the published config; one id or a list).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    /// How the experts are stored.
    #[serde(default)]
    pub quantization_config: Option<QuantConfig>,
}

/// What one layer's attention sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKind {
    /// The last `sliding_window` positions.
    Sliding,
    /// Every position.
    Full,
}

impl GptOssConfig {
    /// Reads and validates `path` (a config.json).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let c: GptOssConfig = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
            path: path.to_path_buf(),
            source: e,
        })?;
        c.validate()?;
        Ok(c)
    }

    /// Every rule the forward pass relies on, each failure naming the field.
    pub fn validate(&self) -> Result<()> {
        Error::rule(self.model_type == "gpt_oss", "model_type", || {
            format!("`{}` is not gpt_oss", self.model_type)
        })?;
        for (f, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("num_local_experts", self.num_local_experts),
            ("num_experts_per_tok", self.top_k()),
            ("vocab_size", self.vocab_size),
            ("sliding_window", self.sliding_window),
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
        Error::rule(self.head_dim.is_multiple_of(2), "head_dim", || {
            "must be even (rotary pairs)".into()
        })?;
        for (f, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
        ] {
            Error::rule(v.is_multiple_of(32), f, || {
                format!("{v} is not a multiple of the MXFP4 group (32)")
            })?;
        }
        if let (Some(a), Some(b)) = (self.num_experts_per_tok, self.experts_per_token) {
            Error::rule(a == b, "experts_per_token", || {
                format!("{b} disagrees with num_experts_per_tok {a}")
            })?;
        }
        Error::rule(
            self.top_k() <= self.num_local_experts,
            "num_experts_per_tok",
            || {
                format!(
                    "{} exceeds num_local_experts {}",
                    self.top_k(),
                    self.num_local_experts
                )
            },
        )?;
        Error::rule(self.attention_bias, "attention_bias", || {
            "only gpt-oss's biased projections are implemented".into()
        })?;
        Error::rule(!self.tie_word_embeddings, "tie_word_embeddings", || {
            "gpt-oss has its own lm_head; tied embeddings are not implemented".into()
        })?;
        if let Some(q) = &self.quantization_config {
            Error::rule(
                q.quant_method == "mxfp4",
                "quantization_config.quant_method",
                || format!("`{}`: only mxfp4 experts are implemented", q.quant_method),
            )?;
        }
        if let Some(r) = &self.rope_scaling {
            Error::rule(r.rope_type == "yarn", "rope_scaling.rope_type", || {
                format!("`{}`: only yarn is implemented", r.rope_type)
            })?;
            Error::rule(r.factor >= 1.0, "rope_scaling.factor", || {
                "must be >= 1".into()
            })?;
            Error::rule(
                r.original_max_position_embeddings > 0,
                "rope_scaling.original_max_position_embeddings",
                || "must be > 0".into(),
            )?;
        }
        if let Some(t) = &self.layer_types {
            Error::rule(t.len() == self.num_hidden_layers, "layer_types", || {
                format!("{} entries for {} layers", t.len(), self.num_hidden_layers)
            })?;
            if let Some(bad) = t
                .iter()
                .find(|k| *k != "sliding_attention" && *k != "full_attention")
            {
                return Err(Error::config(
                    "layer_types",
                    format!("`{bad}` is neither sliding_attention nor full_attention"),
                ));
            }
        }
        self.eos_ids().map(|_| ())
    }

    /// Experts per token (0 when the config names none, which `validate` refuses).
    pub fn top_k(&self) -> usize {
        self.num_experts_per_tok
            .or(self.experts_per_token)
            .unwrap_or(0)
    }

    /// Layer `l`'s attention kind (`layer_types`, or sliding on even layers as published).
    pub fn attn_kind(&self, l: usize) -> AttnKind {
        match &self.layer_types {
            Some(t) if t[l] == "full_attention" => AttnKind::Full,
            Some(_) => AttnKind::Sliding,
            None if l.is_multiple_of(2) => AttnKind::Sliding,
            None => AttnKind::Full,
        }
    }

    /// The ids that end a reply (`eos_token_id`, one or several).
    pub fn eos_ids(&self) -> Result<Vec<u32>> {
        crate::runtime::family::eos_ids(self.eos_token_id.as_ref(), self.vocab_size)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// gpt-oss-120b's published config.json (its fields as the hub serves them).
    pub(crate) const GPT_OSS_120B: &str = r#"{
      "architectures": ["GptOssForCausalLM"], "attention_bias": true, "attention_dropout": 0.0,
      "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
      "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
      "intermediate_size": 2880, "max_position_embeddings": 131072, "model_type": "gpt_oss",
      "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
      "num_key_value_heads": 8, "num_local_experts": 128, "output_router_logits": false,
      "pad_token_id": 199999, "quantization_config": {"modules_to_not_convert":
      ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
      "quant_method": "mxfp4"}, "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0,
      "beta_slow": 1.0, "factor": 32.0, "original_max_position_embeddings": 4096,
      "rope_type": "yarn", "truncate": false}, "rope_theta": 150000,
      "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
      "tie_word_embeddings": false, "use_cache": true, "vocab_size": 201088}"#;

    #[test]
    fn reads_the_published_config() {
        let c: GptOssConfig = serde_json::from_str(GPT_OSS_120B).unwrap();
        c.validate().unwrap();
        assert_eq!(c.num_local_experts, 128);
        assert_eq!(c.top_k(), 4);
        assert_eq!(c.attn_kind(0), AttnKind::Sliding);
        assert_eq!(c.attn_kind(1), AttnKind::Full);
        assert_eq!(c.eos_ids().unwrap(), vec![200002]);
        assert!(!c.rope_scaling.as_ref().unwrap().truncate);
    }

    #[test]
    fn broken_rules_name_the_field() {
        for (from, to, field) in [
            (
                "\"num_key_value_heads\": 8",
                "\"num_key_value_heads\": 7",
                "num_key_value_heads",
            ),
            (
                "\"rope_type\": \"yarn\"",
                "\"rope_type\": \"llama3\"",
                "rope_scaling.rope_type",
            ),
            (
                "\"quant_method\": \"mxfp4\"",
                "\"quant_method\": \"fp8\"",
                "quant_method",
            ),
            (
                "\"hidden_size\": 2880",
                "\"hidden_size\": 2881",
                "hidden_size",
            ),
            (
                "\"model_type\": \"gpt_oss\"",
                "\"model_type\": \"llama\"",
                "model_type",
            ),
        ] {
            let text = GPT_OSS_120B.replace(from, to);
            assert_ne!(text, GPT_OSS_120B, "{from}");
            let c: GptOssConfig = serde_json::from_str(&text).unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }
}
