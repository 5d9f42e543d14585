//! `K3Config`: the model's config.json (root fields plus `text_config`), validated, with the
//! derived layer schedule.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// `text_config.linear_attn_config`: the KDA layers and their dimensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinearAttnConfig {
    /// KDA heads.
    pub num_heads: usize,
    /// KDA head width (K = V).
    pub head_dim: usize,
    /// Depthwise causal conv width.
    pub short_conv_kernel_size: usize,
    /// Whether the output gate is full rank.
    #[serde(default = "default_true")]
    pub use_full_rank_gate: bool,
    /// Lower bound of the log decay gate (−5 for K3).
    pub gate_lower_bound: f64,
    /// One-based list of KDA layers.
    pub kda_layers: Vec<usize>,
    /// One-based list of full-attention (MLA) layers.
    pub full_attn_layers: Vec<usize>,
}

/// `quantization_config.config_groups.*.weights`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantWeights {
    /// Bits per value (4).
    pub num_bits: u32,
    /// Value type (`float`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Quantisation strategy (`group`).
    pub strategy: String,
    /// Elements per scale (32).
    pub group_size: usize,
    /// Everything else, kept for round-tripping.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One entry of `quantization_config.config_groups`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantGroup {
    /// Packing format (`mxfp4-pack-quantized`).
    #[serde(default)]
    pub format: Option<String>,
    /// Weight quantisation parameters.
    pub weights: QuantWeights,
    /// Everything else.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `quantization_config`: how the routed experts are packed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantizationConfig {
    /// `compressed-tensors`.
    pub quant_method: String,
    /// `mxfp4-pack-quantized`.
    pub format: String,
    /// `compressed`.
    #[serde(default)]
    pub quantization_status: Option<String>,
    /// Quantisation groups (K3 has one, `group_0`).
    pub config_groups: std::collections::BTreeMap<String, QuantGroup>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `text_config`: the language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextConfig {
    /// `kimi_linear`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Residual width H.
    pub hidden_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Vocabulary size (BPE ranks + reserved specials).
    pub vocab_size: usize,
    /// Architectural context length (no positional encoding is used).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// Dense MLP width (layers before `first_k_dense_replace`).
    pub intermediate_size: usize,
    /// Number of leading dense layers.
    pub first_k_dense_replace: usize,
    /// MoE every n-th layer after the dense ones.
    #[serde(default = "one")]
    pub moe_layer_freq: usize,
    /// Routed experts per MoE layer.
    pub num_experts: usize,
    /// Top-k.
    pub num_experts_per_token: usize,
    /// Shared experts (fused into one MLP of width `num_shared_experts * moe_intermediate_size`).
    pub num_shared_experts: usize,
    /// Per-expert FFN width.
    pub moe_intermediate_size: usize,
    /// Latent width in which the routed experts run.
    pub routed_expert_hidden_size: usize,
    /// RMSNorm on the combined routed output.
    #[serde(default = "default_true")]
    pub latent_moe_use_norm: bool,
    /// Router activation (`sigmoid`).
    #[serde(default = "sigmoid")]
    pub moe_router_activation_func: String,
    /// `noaux_tc`.
    #[serde(default)]
    pub topk_method: Option<String>,
    /// Grouped top-k flag (no effect with one group).
    #[serde(default)]
    pub use_grouped_topk: bool,
    /// Expert groups.
    #[serde(default = "one")]
    pub num_expert_group: usize,
    /// Groups kept.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Renormalise the top-k weights.
    #[serde(default = "default_true")]
    pub moe_renormalize: bool,
    /// Never applied by K3 (it is 1.0).
    #[serde(default = "one_f64")]
    pub routed_scaling_factor: f64,
    /// `situ`.
    pub hidden_act: String,
    /// SiTU gate beta.
    #[serde(default = "situ_beta")]
    pub activation_situ_beta: f64,
    /// SiTU linear beta.
    #[serde(default = "situ_linear_beta")]
    pub activation_situ_linear_beta: f64,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// MLA heads.
    pub num_attention_heads: usize,
    /// MLA KV heads (must equal the heads).
    pub num_key_value_heads: usize,
    /// MLA query LoRA rank.
    pub q_lora_rank: usize,
    /// MLA latent KV width.
    pub kv_lora_rank: usize,
    /// MLA no-position head width.
    pub qk_nope_head_dim: usize,
    /// MLA "rope" head width (no rotary is applied).
    pub qk_rope_head_dim: usize,
    /// MLA value head width.
    pub v_head_dim: usize,
    /// No RoPE anywhere.
    #[serde(default = "default_true")]
    pub mla_use_nope: bool,
    /// Gated MLA output.
    #[serde(default = "default_true")]
    pub mla_use_output_gate: bool,
    /// AttnRes block size in layers.
    pub attn_res_block_size: usize,
    /// MTP layers (0).
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    /// KDA parameters and the layer lists.
    pub linear_attn_config: LinearAttnConfig,
    /// MXFP4 expert quantisation (may also sit at the root).
    #[serde(default)]
    pub quantization_config: Option<QuantizationConfig>,
    /// Tied embeddings (false for K3).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// BOS id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-message id, the generation stop token.
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    /// PAD id.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// The root of config.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RootConfig {
    /// `kimi_k3`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Storage dtype of the dense weights.
    #[serde(default)]
    pub dtype: Option<String>,
    /// Tied embeddings.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// BOS id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// Stop token id.
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    /// PAD id.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// The language model.
    pub text_config: TextConfig,
    /// Quantisation (when given at the root instead of in `text_config`).
    #[serde(default)]
    pub quantization_config: Option<QuantizationConfig>,
    /// Everything else (vision config, auto_map, ...).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// Which attention a layer runs (`kda`/`mla` in reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttnKind {
    /// Kimi Delta Attention (linear, recurrent).
    #[default]
    Kda,
    /// Gated multi-head latent attention (NoPE).
    Mla,
}

/// Which feed-forward block a layer runs (`dense`/`moe` in reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FfnKind {
    /// Dense SiTU MLP.
    #[default]
    Dense,
    /// Latent MoE with shared experts.
    Moe,
}

impl AttnKind {
    /// `kda` or `mla` (the layer profile's label).
    pub fn label(self) -> &'static str {
        match self {
            AttnKind::Kda => "kda",
            AttnKind::Mla => "mla",
        }
    }
}

impl FfnKind {
    /// `dense` or `moe` (the layer profile's label).
    pub fn label(self) -> &'static str {
        match self {
            FfnKind::Dense => "dense",
            FfnKind::Moe => "moe",
        }
    }
}

impl std::fmt::Display for AttnKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.label())
    }
}

impl std::fmt::Display for FfnKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.label())
    }
}

/// The derived kind of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    /// Attention type.
    pub attn: AttnKind,
    /// Feed-forward type.
    pub ffn: FfnKind,
}

/// The validated model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct K3Config {
    /// The parsed root (with `text_config`).
    pub root: RootConfig,
    /// Per-layer kinds, index = 0-based layer.
    pub schedule: Vec<LayerKind>,
    /// The MXFP4 group size (elements per scale).
    pub group_size: usize,
    /// The generation stop token.
    pub eos_token_id: u32,
}

fn default_true() -> bool {
    true
}
fn one() -> usize {
    1
}
fn one_f64() -> f64 {
    1.0
}
fn sigmoid() -> String {
    "sigmoid".into()
}
fn situ_beta() -> f64 {
    4.0
}
fn situ_linear_beta() -> f64 {
    25.0
}

impl K3Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let root: RootConfig = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
            path: path.to_path_buf(),
            source: e,
        })?;
        Self::from_root(root)
    }

    /// Parses and validates config.json text.
    pub fn from_json(text: &str) -> Result<Self> {
        let root: RootConfig = serde_json::from_str(text).map_err(|e| Error::Json {
            path: "config.json".into(),
            source: e,
        })?;
        Self::from_root(root)
    }

    /// The language-model part.
    pub fn text(&self) -> &TextConfig {
        &self.root.text_config
    }

    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.schedule.len()
    }

    /// Indices of the MoE layers.
    pub fn moe_layers(&self) -> impl Iterator<Item = usize> + '_ {
        self.schedule
            .iter()
            .enumerate()
            .filter(|(_, k)| k.ffn == FfnKind::Moe)
            .map(|(l, _)| l)
    }

    /// MXFP4 shapes `(rows, cols)` of the three expert matrices w1 (gate), w2 (down), w3 (up).
    pub fn expert_matrix_shapes(&self) -> [(usize, usize); 3] {
        let t = self.text();
        let (i, r) = (t.moe_intermediate_size, t.routed_expert_hidden_size);
        [(i, r), (r, i), (i, r)]
    }

    /// Bytes of one routed expert's raw span (six tensors, no padding).
    pub fn expert_span_bytes(&self) -> usize {
        self.expert_matrix_shapes()
            .iter()
            .map(|&(r, c)| r * c / 2 + r * c / self.group_size)
            .sum()
    }

    /// Fused shared-expert width.
    pub fn shared_width(&self) -> usize {
        self.text().num_shared_experts * self.text().moe_intermediate_size
    }
}

pub(crate) mod validate;

#[cfg(test)]
mod tests;
