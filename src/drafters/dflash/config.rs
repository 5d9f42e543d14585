//! A DFlash block drafter's `config.json` in either published spelling, read into one shape:
//! vLLM `speculators`' (`speculators_model_type: "dflash"`, or `"dspark"` with its sequential
//! head's `markov_rank` and `markov_head_type`, the layers' Qwen3 config under
//! `transformer_layer_config`, `aux_hidden_state_layer_ids` counting capture points: the
//! input of layer `j`, i.e. the output of layer `j − 1`) and z-lab's original
//! (`architectures: ["DFlashDraftModel"]`, a Qwen3 config at the top, `dflash_config` with
//! `target_layer_ids` counting layer outputs, `block_size` at the top or inside `dflash_config`;
//! speculators' converter maps one to the other by `+ 1`). Owns the parsing and its errors; no
//! tensors.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// Which published spelling a DFlash head's config uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DFlashSpelling {
    /// vLLM `speculators`: `speculators_model_type: "dflash"`.
    Speculators,
    /// z-lab's original release: `architectures: ["DFlashDraftModel"]`, `dflash_config`.
    ZLab,
}

/// A DFlash head's shape and options.
#[derive(Debug, Clone, PartialEq)]
pub struct DFlashConfig {
    /// The spelling the config uses.
    pub spelling: DFlashSpelling,
    /// Decoder layers.
    pub layers: usize,
    /// The hidden size (the target's: the head reads the target's embedding rows).
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// The MLP's width.
    pub intermediate: usize,
    /// Projections carry biases (`attention_bias`).
    pub attention_bias: bool,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotary base.
    pub rope_theta: f64,
    /// The target's vocabulary `V`.
    pub vocab: usize,
    /// The head's vocabulary `Vd` (`V` when it predicts target ids directly).
    pub draft_vocab: usize,
    /// Positions in one drafted block, the anchor's included.
    pub block_size: usize,
    /// Target layers whose output rows are fused by `fc`, ascending (0-based; the rows after
    /// each layer).
    pub tap_layers: Vec<usize>,
    /// The token whose embedding fills the block's positions after the anchor.
    pub mask_token_id: u32,
    /// The anchor's own slot predicts the next token (the block drafts `block_size` tokens);
    /// otherwise slot `i ≥ 1` predicts the token at the anchor's position plus `i`. DSpark's
    /// default, not DFlash's.
    pub sample_from_anchor: bool,
    /// DSpark's sequential head: a low-rank logit bias from the token before each slot.
    pub markov: Option<Markov>,
}

/// DSpark's sequential (Markov) head: `bias = W2 · f(W1[prev])`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Markov {
    /// The rank `r` of `W1` `[V, r]` and `W2` `[Vd, r]`.
    pub rank: usize,
    /// How the previous token's row becomes the bias.
    pub kind: MarkovKind,
}

/// The published variants of DSpark's sequential head (`markov_head_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkovKind {
    /// `W2 · W1[prev]`.
    Vanilla,
    /// `W2 · (σ(gate([hidden, W1[prev]])) ⊙ W1[prev])`.
    Gated,
    /// A recurrent state over the block's slots: `[g; c; o] = joint([state, W1[prev],
    /// hidden])`, `state = σ(g)·state + (1 − σ(g))·tanh(c)`, bias `W2 · tanh(o)`.
    Rnn,
}

fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn ids(v: Option<&Value>) -> Option<Vec<usize>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(Value::as_u64)
            .map(|x| x as usize)
            .collect()
    })
}

impl DFlashConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let (v, path) = crate::drafters::parts::read_config(dir)?;
        Self::from_value(&v, &path)
    }

    /// Whether a parsed `config.json` is a DFlash head's, in either spelling.
    pub fn is_dflash(v: &Value) -> bool {
        matches!(
            v.get("speculators_model_type").and_then(Value::as_str),
            Some("dflash" | "dspark")
        ) || v.get("dflash_config").is_some_and(Value::is_object)
    }

    /// Reads a parsed `config.json` (`path` names it in errors).
    pub fn from_value(v: &Value, path: &Path) -> Result<Self> {
        let err = |msg: String| Error::Config {
            field: "config.json".into(),
            rule: format!("{}: {msg}", path.display()),
        };
        let need = |layer: &Value, key: &str| {
            get_usize(layer, key).ok_or_else(|| {
                err(format!(
                    "`{key}` is missing or not a number (a DFlash head needs it)"
                ))
            })
        };
        let (spelling, layer, taps, mask, block) = match v
            .get("speculators_model_type")
            .and_then(Value::as_str)
        {
            Some("dflash" | "dspark") => {
                let layer = v
                    .get("transformer_layer_config")
                    .ok_or_else(|| err("`transformer_layer_config` is missing".into()))?;
                // Capture points: the input of layer j is the output of layer j − 1.
                let taps = ids(v.get("aux_hidden_state_layer_ids"))
                    .ok_or_else(|| err("`aux_hidden_state_layer_ids` is missing".into()))?;
                if taps.contains(&0) {
                    return Err(err(
                        "aux_hidden_state_layer_ids holds 0 (the embedding output): not supported"
                            .into(),
                    ));
                }
                let taps = taps.iter().map(|&j| j - 1).collect();
                (
                    DFlashSpelling::Speculators,
                    layer,
                    taps,
                    v.get("mask_token_id"),
                    v.get("block_size"),
                )
            }
            Some(other) => {
                return Err(err(format!(
                    "speculators_model_type `{other}` is not a DFlash head (dflash, dspark)"
                )))
            }
            None => {
                let d = v
                        .get("dflash_config")
                        .filter(|d| d.is_object())
                        .ok_or_else(|| err("not a DFlash head: no `dflash_config` and no speculators_model_type `dflash`".into()))?;
                let taps = ids(d.get("target_layer_ids"))
                    .ok_or_else(|| err("`dflash_config.target_layer_ids` is missing".into()))?;
                let block = v.get("block_size").or_else(|| d.get("block_size"));
                (DFlashSpelling::ZLab, v, taps, d.get("mask_token_id"), block)
            }
        };
        if taps.is_empty() || taps.windows(2).any(|w| w[0] >= w[1]) {
            return Err(err(format!(
                "the tapped target layers {taps:?} must be distinct and ascending"
            )));
        }
        if layer
            .get("layer_types")
            .and_then(Value::as_array)
            .is_some_and(|t| t.iter().any(|x| x.as_str() != Some("full_attention")))
        {
            return Err(err(
                "sliding-window draft layers are not supported yet (every layer must be full_attention)".into(),
            ));
        }
        let shape = crate::drafters::parts::LayerShape::read(layer).map_err(&err)?;
        let dspark = v.get("speculators_model_type").and_then(Value::as_str) == Some("dspark");
        let vocab = shape.vocab;
        let mask_token_id = mask.and_then(Value::as_u64).ok_or_else(|| {
            err("`mask_token_id` is missing (the block's mask positions need it)".into())
        })?;
        if mask_token_id as usize >= vocab {
            return Err(err(format!(
                "mask_token_id {mask_token_id} is past the vocabulary ({vocab})"
            )));
        }
        let block_size = block.and_then(Value::as_u64).unwrap_or(8) as usize;
        if block_size < 2 {
            return Err(err(format!(
                "block_size {block_size}: a block drafts from 2 positions up"
            )));
        }
        Ok(DFlashConfig {
            spelling,
            layers: need(layer, "num_hidden_layers")?,
            hidden: shape.hidden,
            heads: shape.heads,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim,
            intermediate: shape.intermediate,
            attention_bias: layer
                .get("attention_bias")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            eps: shape.eps,
            rope_theta: shape.rope_theta,
            vocab,
            draft_vocab: get_usize(v, "draft_vocab_size").unwrap_or(vocab),
            block_size,
            tap_layers: taps,
            mask_token_id: mask_token_id as u32,
            sample_from_anchor: v
                .get("sample_from_anchor")
                .and_then(Value::as_bool)
                .unwrap_or(dspark),
            markov: match (dspark, get_usize(v, "markov_rank").unwrap_or(256)) {
                (false, _) | (true, 0) => None,
                (true, rank) => Some(Markov {
                    rank,
                    kind: match v.get("markov_head_type").and_then(Value::as_str) {
                        None | Some("vanilla") => MarkovKind::Vanilla,
                        Some("gated") => MarkovKind::Gated,
                        Some("rnn") => MarkovKind::Rnn,
                        Some(other) => {
                            return Err(err(format!(
                                "markov_head_type `{other}` (vanilla, gated or rnn)"
                            )))
                        }
                    },
                }),
            },
        })
    }

    /// Tokens one block drafts.
    pub fn drafts_per_block(&self) -> usize {
        match self.sample_from_anchor {
            true => self.block_size,
            false => self.block_size - 1,
        }
    }

    /// The block slot whose logits give the first draft.
    pub fn first_slot(&self) -> usize {
        usize::from(!self.sample_from_anchor)
    }
}
