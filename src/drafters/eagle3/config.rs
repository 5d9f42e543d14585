//! An EAGLE-3 head's `config.json` in either published spelling, read into one shape:
//! SpecForge/SGLang's (a Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
//! `draft_vocab_size`, `target_hidden_size`, `eagle_config.eagle_aux_hidden_state_layer_ids`;
//! tensors under `midlayer.`) and vLLM `speculators`' (`speculators_model_type: "eagle3"`, the
//! layer's config under `transformer_layer_config`, the head's keys at the top; tensors under
//! `layers.0.`). The two differ in what some keys mean; this module settles each into one
//! field (see the field docs). Owns the parsing and its errors; no tensors.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// Which published spelling a head's files use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spelling {
    /// SpecForge / SGLang: `LlamaForCausalLMEagle3`, tensors under `midlayer.`.
    SpecForge,
    /// vLLM `speculators`: `speculators_model_type: "eagle3"`, tensors under `layers.0.`.
    Speculators,
}

/// An EAGLE-3 head's shape and options.
#[derive(Debug, Clone, PartialEq)]
pub struct Eagle3Config {
    /// The spelling the files use.
    pub spelling: Spelling,
    /// The head's hidden size `H`.
    pub hidden: usize,
    /// The target's hidden size `Ht` (the width of each tapped row).
    pub target_hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// The MLP's width.
    pub intermediate: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotary base.
    pub rope_theta: f64,
    /// The target's vocabulary `V`.
    pub vocab: usize,
    /// The head's vocabulary `Vd` (`V` when the head predicts target ids directly).
    pub draft_vocab: usize,
    /// Target layers whose output rows are fused, ascending (0-based; the rows after each
    /// layer). `None`: the default for a target of `L` layers, `[1, L/2 − 1, L − 4]`.
    pub tap_layers: Option<Vec<usize>>,
    /// The residual of the attention block is the normalised incoming row (speculators'
    /// `norm_before_residual`; SpecForge never does this).
    pub norm_before_residual: bool,
    /// One RMSNorm over the concatenated taps before `fc` (`input_norm.weight`).
    pub norm_before_fc: bool,
    /// One RMSNorm per tap before `fc` (`fc_norm.{i}.weight`, EAGLE-3.1).
    pub fc_norm: bool,
    /// The row fed to the next step is the final norm's output (speculators' `norm_output`);
    /// otherwise the row before it (SpecForge, whatever its `norm_output` says).
    pub feed_normed: bool,
    /// Qwen3's per-head q/k RMSNorms in the layer (`transformer_layer_config.model_type`
    /// `qwen3`).
    pub qk_norm: bool,
}

fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

impl Eagle3Config {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let (v, path) = crate::drafters::parts::read_config(dir)?;
        Self::from_value(&v, &path)
    }

    /// Reads a parsed `config.json` (`path` names it in errors).
    pub fn from_value(v: &Value, path: &Path) -> Result<Self> {
        let cfg_err = |msg: String| Error::Config {
            field: "config.json".into(),
            rule: format!("{}: {msg}", path.display()),
        };
        let speculators = v.get("speculators_model_type").and_then(Value::as_str);
        let (spelling, layer) = match speculators {
            Some("eagle3") => (
                Spelling::Speculators,
                v.get("transformer_layer_config")
                    .ok_or_else(|| cfg_err("`transformer_layer_config` is missing".into()))?,
            ),
            Some(other) => {
                return Err(cfg_err(format!(
                    "speculators_model_type `{other}` is not an EAGLE-3 head (eagle3)"
                )))
            }
            None => {
                let arch = v
                    .get("architectures")
                    .and_then(|a| a.get(0))
                    .and_then(Value::as_str);
                if arch != Some("LlamaForCausalLMEagle3") {
                    return Err(cfg_err(format!(
                        "not an EAGLE-3 head: architectures {:?} (LlamaForCausalLMEagle3 or \
                         speculators_model_type eagle3)",
                        arch.unwrap_or("missing")
                    )));
                }
                (Spelling::SpecForge, v)
            }
        };
        let layers = get_usize(layer, "num_hidden_layers").unwrap_or(1);
        if layers != 1 {
            return Err(cfg_err(format!(
                "a head of {layers} decoder layers: only the published single-layer head is supported"
            )));
        }
        let shape = crate::drafters::parts::LayerShape::read(layer).map_err(&cfg_err)?;
        let vocab = shape.vocab;
        let draft_vocab = get_usize(v, "draft_vocab_size").unwrap_or(vocab);
        let model_type = layer.get("model_type").and_then(Value::as_str);
        let ids = match spelling {
            Spelling::SpecForge => v
                .get("eagle_config")
                .and_then(|e| e.get("eagle_aux_hidden_state_layer_ids")),
            Spelling::Speculators => v.get("eagle_aux_hidden_state_layer_ids"),
        };
        let tap_layers = match ids.filter(|x| !x.is_null()) {
            None => None,
            Some(list) => {
                let list: Vec<usize> = list
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_u64)
                            .map(|x| x as usize)
                            .collect()
                    })
                    .unwrap_or_default();
                // speculators counts capture points (the input of layer j = the output of j − 1).
                let list: Vec<usize> = match spelling {
                    Spelling::SpecForge => list,
                    Spelling::Speculators => list.iter().map(|&j| j.saturating_sub(1)).collect(),
                };
                if list.len() != 3 {
                    return Err(cfg_err(format!(
                        "eagle_aux_hidden_state_layer_ids holds {} layers; an EAGLE-3 head fuses 3",
                        list.len()
                    )));
                }
                Some(list)
            }
        };
        let spec = spelling == Spelling::Speculators;
        Ok(Eagle3Config {
            spelling,
            hidden: shape.hidden,
            target_hidden: get_usize(v, "target_hidden_size").unwrap_or(shape.hidden),
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            intermediate: shape.intermediate,
            eps: shape.eps,
            rope_theta: shape.rope_theta,
            vocab,
            draft_vocab,
            tap_layers,
            // vLLM reads a speculators head without the key as `true`; SpecForge has no such step.
            norm_before_residual: spec && flag(v, "norm_before_residual", true),
            norm_before_fc: flag(v, "norm_before_fc", false),
            fc_norm: flag(v, "fc_norm", false),
            feed_normed: spec && flag(v, "norm_output", false),
            qk_norm: model_type == Some("qwen3"),
        })
    }

    /// The target layers fused for a target of `layers` decoder layers.
    pub fn taps(&self, layers: usize) -> Vec<usize> {
        self.tap_layers
            .clone()
            .unwrap_or_else(|| vec![1, (layers / 2).saturating_sub(1), layers.saturating_sub(4)])
    }

    /// The prefix of the decoder layer's tensors.
    pub fn layer_prefix(&self) -> &'static str {
        match self.spelling {
            Spelling::SpecForge => "midlayer.",
            Spelling::Speculators => "layers.0.",
        }
    }
}
