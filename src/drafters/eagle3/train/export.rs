//! Writes a trained head in SpecForge's published EAGLE-3 layout (docs/drafters.md): a Llama
//! `config.json` with `architectures: ["LlamaForCausalLMEagle3"]`, `draft_vocab_size`,
//! `target_hidden_size` and the tapped layers, and one safetensors file with the `midlayer.*`
//! tensors, `fc`, `norm`, `lm_head`, the head's own `embed_tokens`, `d2t` (I64) and `t2d`
//! (BOOL). Every file is written atomically. Owns the layout of what it writes.

use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::net::{HeadNet, EPS, ROPE_THETA};
use crate::fsio::atomic::write_atomic;
use crate::{Error, Result};

/// How the exported weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDtype {
    /// bfloat16 (half the bytes; how published heads ship).
    Bf16,
    /// float32 (bit-equal to the trained values).
    F32,
}

/// The config.json of `net` tapping `layers`.
pub fn config_json(net: &HeadNet, layers: &[usize; 3]) -> serde_json::Value {
    let d = net.dims;
    serde_json::json!({
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": d.hidden,
        "target_hidden_size": d.target_hidden,
        "num_attention_heads": d.heads,
        "num_key_value_heads": d.heads,
        "head_dim": d.head_dim,
        "intermediate_size": d.intermediate,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": null,
        "max_position_embeddings": 1 << 20,
        "vocab_size": d.vocab,
        "draft_vocab_size": d.draft_vocab,
        "tie_word_embeddings": false,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers},
    })
}

/// Writes `net` (draft vocabulary `vocab`, ascending target ids) into `dir`.
pub fn export(
    net: &HeadNet,
    vocab: &[u32],
    layers: &[usize; 3],
    dtype: WeightDtype,
    dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let mut data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, v) in &net.vars {
        let t = v.as_tensor();
        let vals: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let (dt, bytes): (Dtype, Vec<u8>) = match dtype {
            WeightDtype::F32 => (
                Dtype::F32,
                vals.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            WeightDtype::Bf16 => (
                Dtype::BF16,
                vals.iter()
                    .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                    .collect(),
            ),
        };
        data.push((name.clone(), dt, t.dims().to_vec(), bytes));
    }
    let d2t: Vec<u8> = vocab
        .iter()
        .enumerate()
        .flat_map(|(d, &t)| (t as i64 - d as i64).to_le_bytes())
        .collect();
    data.push(("d2t".into(), Dtype::I64, vec![vocab.len()], d2t));
    let mut t2d = vec![0u8; net.dims.vocab];
    for &t in vocab {
        t2d[t as usize] = 1;
    }
    data.push(("t2d".into(), Dtype::BOOL, vec![net.dims.vocab], t2d));
    let views = data
        .iter()
        .map(|(n, dt, s, b)| {
            TensorView::new(*dt, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::Msg(format!("{n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("model.safetensors"), &bytes)?;
    let cfg = serde_json::to_vec_pretty(&config_json(net, layers))
        .map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("config.json"), &cfg)
}
