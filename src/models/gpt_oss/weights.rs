//! gpt-oss's dense tensors bound at load: where each matrix lies in the mapped shards
//! (`Stored`), each layer's projections with their biases widened (`Layer`), checked against
//! the config's shapes with errors naming the tensor. Owns no arithmetic.

use memmap2::Mmap;
use safetensors::Dtype;

use crate::checkpoint::Inventory;
use crate::{Error, Result};

use super::attention::AttnShape;
use super::config::{AttnKind, GptOssConfig};
use super::names;

/// Where one stored matrix or vector lies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stored {
    pub(super) shard: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) dtype: Dtype,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

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

/// BF16 or F32 little-endian bytes as f32.
pub(super) fn to_f32(b: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// A `[rows, cols]` BF16 or F32 tensor.
pub(super) fn matrix(inv: &Inventory, name: &str, rows: usize, cols: usize) -> Result<Stored> {
    let t = inv.get(name).ok_or_else(|| Error::Tensor {
        name: name.into(),
        msg: format!("missing from the checkpoint in {}", inv.dir.display()),
    })?;
    let shape_ok = t.shape == [rows, cols] || (rows == 1 && t.shape == [cols]);
    if !matches!(t.dtype, Dtype::BF16 | Dtype::F32) || !shape_ok {
        return Err(Error::Tensor {
            name: name.into(),
            msg: format!(
                "expected BF16 or F32 [{rows}, {cols}], found {} {:?}",
                t.dtype, t.shape
            ),
        });
    }
    Ok(Stored {
        shard: t.shard,
        start: t.start as usize,
        end: t.end as usize,
        dtype: t.dtype,
        rows,
        cols,
    })
}

/// A `[n]` BF16 or F32 vector, widened.
pub(super) fn vector(inv: &Inventory, maps: &[Mmap], name: &str, n: usize) -> Result<Vec<f32>> {
    let s = matrix(inv, name, 1, n)?;
    Ok(to_f32(&maps[s.shard][s.start..s.end], s.dtype))
}

pub(super) fn load_layer(
    inv: &Inventory,
    maps: &[Mmap],
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
            b: vector(inv, maps, &n(&format!("{p}.bias")), rows)?,
        })
    };
    Ok(Layer {
        input_norm: vector(inv, maps, &n("input_layernorm.weight"), h)?,
        post_norm: vector(inv, maps, &n("post_attention_layernorm.weight"), h)?,
        q: linear("self_attn.q_proj", qd, h)?,
        k: linear("self_attn.k_proj", kd, h)?,
        v: linear("self_attn.v_proj", kd, h)?,
        o: linear("self_attn.o_proj", h, qd)?,
        sinks: vector(inv, maps, &n("self_attn.sinks"), cfg.num_attention_heads)?,
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
