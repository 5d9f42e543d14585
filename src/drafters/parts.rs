//! What the draft heads share: their `config.json` (`read_config`) and its decoder layer's shape
//! (`LayerShape`), a linear layer with an optional bias over mapped tensors (`Linear`), and the
//! `d2t` map from a draft vocabulary to target ids (`read_d2t`). Owns these pieces; each
//! head's math stays in its own folder.

use safetensors::Dtype;

use crate::checkpoint::Inventory;
use crate::layers::mapped::{matrix, Mapped, Stored};
use crate::{Error, Result};

/// A linear layer's weight and optional bias, read in place.
pub(crate) struct Linear {
    w: Stored,
    b: Option<Vec<f32>>,
}

impl Linear {
    /// `name.weight` `[rows, cols]` and, when present, `name.bias` `[rows]`.
    pub(crate) fn open(
        inv: &Inventory,
        map: &Mapped,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Linear> {
        let w = matrix(inv, &format!("{name}.weight"), rows, cols)?;
        let bias = format!("{name}.bias");
        let b = match inv.get(&bias) {
            Some(_) => Some(map.vector(inv, &bias, rows)?),
            None => None,
        };
        Ok(Linear { w, b })
    }

    /// `x · Wᵀ + b` for `t` rows of `x`.
    pub(crate) fn apply(&self, map: &Mapped, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let mut y = map.matmul(&self.w, x, t)?;
        if let Some(b) = &self.b {
            for row in y.chunks_mut(b.len()) {
                row.iter_mut().zip(b).for_each(|(a, c)| *a += c);
            }
        }
        Ok(y)
    }
}

/// `d2t` as int64 offsets `[Vd]` (target id = draft id + offset); absent only when the head
/// predicts target ids directly (`draft_vocab == vocab`).
pub(crate) fn read_d2t(
    inv: &Inventory,
    map: &Mapped,
    draft_vocab: usize,
    vocab: usize,
) -> Result<Vec<i64>> {
    let Some(t) = inv.get("d2t") else {
        if draft_vocab == vocab {
            return Ok(Vec::new());
        }
        return Err(Error::Tensor {
            name: "d2t".into(),
            msg: format!(
                "missing: a draft vocabulary of {draft_vocab} ids needs it to reach the target's {vocab}"
            ),
        });
    };
    if t.dtype != Dtype::I64 || t.shape != [draft_vocab] {
        return Err(Error::Tensor {
            name: "d2t".into(),
            msg: format!(
                "expected I64 [{draft_vocab}], found {} {:?}",
                t.dtype, t.shape
            ),
        });
    }
    let s = Stored {
        shard: t.shard,
        start: t.start as usize,
        end: t.end as usize,
        dtype: t.dtype,
        rows: 1,
        cols: draft_vocab,
    };
    let d2t: Vec<i64> = map
        .bytes(&s)
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .collect();
    if let Some((d, _)) = d2t
        .iter()
        .enumerate()
        .find(|&(d, &o)| d as i64 + o < 0 || (d as i64 + o) as usize >= vocab)
    {
        return Err(Error::Tensor {
            name: "d2t".into(),
            msg: format!("draft id {d} maps outside the target's vocabulary"),
        });
    }
    Ok(d2t)
}

/// The target id of draft id `d` under `d2t` (empty: the ids are the target's).
pub(crate) fn target_id(d2t: &[i64], d: usize) -> u32 {
    (d as i64 + d2t.get(d).copied().unwrap_or(0)) as u32
}

/// `dir/config.json`, parsed, and its path (for errors).
pub(crate) fn read_config(
    dir: &std::path::Path,
) -> Result<(serde_json::Value, std::path::PathBuf)> {
    let path = dir.join("config.json");
    let bytes = std::fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let v = serde_json::from_slice(&bytes).map_err(|e| Error::Json {
        path: path.clone(),
        source: e,
    })?;
    Ok((v, path))
}

/// A draft layer's shape as a transformers config spells it (Llama or Qwen3 keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LayerShape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub eps: f32,
    pub rope_theta: f64,
    pub vocab: usize,
}

impl LayerShape {
    /// Reads `layer`; the error is the rule broken (the caller names the file).
    pub(crate) fn read(layer: &serde_json::Value) -> std::result::Result<Self, String> {
        use serde_json::Value;
        let get = |k: &str| layer.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let need = |k: &str| get(k).ok_or(format!("`{k}` is missing or not a number"));
        // Rotary settings: `rope_theta` and `rope_scaling`, or (transformers 5) one
        // `rope_parameters` object holding `rope_theta` and `rope_type`.
        let params = layer.get("rope_parameters").filter(|p| p.is_object());
        let scaled = layer.get("rope_scaling").is_some_and(|s| !s.is_null())
            || params
                .and_then(|p| p.get("rope_type"))
                .and_then(Value::as_str)
                .is_some_and(|t| t != "default");
        if scaled {
            return Err(
                "the rotary frequencies are scaled: not supported for draft heads yet".into(),
            );
        }
        let hidden = need("hidden_size")?;
        let heads = need("num_attention_heads")?;
        let kv_heads = get("num_key_value_heads").unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(format!(
                "{heads} attention heads over {kv_heads} key/value heads"
            ));
        }
        Ok(LayerShape {
            hidden,
            heads,
            kv_heads,
            head_dim: get("head_dim").unwrap_or(hidden / heads),
            intermediate: need("intermediate_size")?,
            eps: layer
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta: layer
                .get("rope_theta")
                .or_else(|| params.and_then(|p| p.get("rope_theta")))
                .and_then(Value::as_f64)
                .unwrap_or(10_000.0),
            vocab: need("vocab_size")?,
        })
    }
}
