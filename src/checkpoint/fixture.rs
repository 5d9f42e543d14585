//! Fixture writers: K3-nano (a complete, tiny K3-format model) and K3-slice (real K3 per-layer
//! dimensions, few layers and experts, for benchmarks). Every file is written to a temporary
//! name, fsynced and renamed, so a crash never leaves a half-written shard.

use std::io::Write;
use std::path::Path;

use half::bf16;
use rayon::prelude::*;

use super::header::{build_header, StDtype};
use super::rng::Rng;
use super::tiktoken_fixture::{
    tiktoken_model_text, tokenizer_config_json, train_ranks, NUM_SPECIALS,
};
use crate::config::{AttnKind, FfnKind, K3Config};
use crate::{Error, Result};

/// How a fixture tensor is filled.
#[derive(Debug, Clone, Copy)]
pub enum Init {
    /// Approximately normal with this standard deviation.
    Normal(f32),
    /// `1 + Normal(std)` (norm weights).
    OnePlus(f32),
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// `ln(uniform[lo, hi))` (KDA `A_log`).
    LogUniform(f32, f32),
    /// Random bytes (MXFP4 packed nibbles).
    Bytes,
    /// E8M0 scale bytes in `center-1 ..= center+1`.
    Scale(u8),
}

/// One tensor to write.
#[derive(Debug, Clone)]
pub struct Spec {
    /// Full name.
    pub name: String,
    /// Element type (BF16, F32 or U8).
    pub dtype: StDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Fill rule.
    pub init: Init,
}

impl Spec {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    fn bytes(&self) -> u64 {
        self.numel() as u64 * self.dtype.size()
    }
}

/// Tensors that must stay in one shard together (a layer's dense tensors, a layer's expert run).
pub type Unit = Vec<Spec>;

/// Options of the K3-nano fixture.
#[derive(Debug, Clone)]
pub struct NanoOptions {
    /// Seed of every random value.
    pub seed: u64,
    /// Number of shards (at least 2).
    pub shards: usize,
    /// Store each expert's six tensors contiguously (K3's layout) or scattered.
    pub contiguous_experts: bool,
}

impl Default for NanoOptions {
    fn default() -> Self {
        NanoOptions {
            seed: 0,
            shards: 4,
            contiguous_experts: true,
        }
    }
}

fn normal_fast(rng: &mut Rng) -> f32 {
    // Irwin–Hall with four 16-bit uniforms: mean 2, variance 1/3.
    let r = rng.next_u64();
    let s: f32 = (0..4)
        .map(|k| ((r >> (16 * k)) & 0xFFFF) as f32 / 65536.0)
        .sum();
    (s - 2.0) * 3f32.sqrt()
}

fn fill_chunk(spec: &Spec, seed: u64, chunk: usize, n: usize) -> Vec<u8> {
    let mut h = seed ^ 0xD1B5_4A32_D192_ED03;
    for b in spec.name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01B3);
    }
    let mut rng = Rng::new(h ^ (chunk as u64).wrapping_mul(0x9E37_79B9));
    let mut out = Vec::with_capacity(n * spec.dtype.size() as usize);
    let value = |rng: &mut Rng| -> f32 {
        match spec.init {
            Init::Normal(s) => normal_fast(rng) * s,
            Init::OnePlus(s) => 1.0 + normal_fast(rng) * s,
            Init::Uniform(lo, hi) => lo + (hi - lo) * rng.uniform() as f32,
            Init::LogUniform(lo, hi) => (lo + (hi - lo) * rng.uniform() as f32).ln(),
            Init::Bytes | Init::Scale(_) => 0.0,
        }
    };
    match (spec.dtype, spec.init) {
        (StDtype::U8, Init::Bytes) => {
            while out.len() < n {
                let r = rng.next_u64().to_le_bytes();
                let k = (n - out.len()).min(8);
                out.extend_from_slice(&r[..k]);
            }
        }
        (StDtype::U8, Init::Scale(c)) => {
            for _ in 0..n {
                out.push(c.saturating_sub(1).saturating_add(rng.below(3) as u8));
            }
        }
        (StDtype::BF16, _) => {
            for _ in 0..n {
                out.extend_from_slice(&bf16::from_f32(value(&mut rng)).to_le_bytes());
            }
        }
        _ => {
            for _ in 0..n {
                out.extend_from_slice(&value(&mut rng).to_le_bytes());
            }
        }
    }
    out
}

const CHUNK: usize = 1 << 20;

fn write_tensor(w: &mut impl Write, spec: &Spec, seed: u64, path: &Path) -> Result<()> {
    let n = spec.numel();
    let chunks = n.div_ceil(CHUNK);
    // Generate a batch of chunks in parallel, then write them in order.
    let batch = rayon::current_num_threads().max(1) * 2;
    let mut c0 = 0;
    while c0 < chunks {
        let c1 = (c0 + batch).min(chunks);
        let bufs: Vec<Vec<u8>> = (c0..c1)
            .into_par_iter()
            .map(|c| fill_chunk(spec, seed, c, (n - c * CHUNK).min(CHUNK)))
            .collect();
        for b in bufs {
            w.write_all(&b).map_err(|e| Error::io(path, e))?;
        }
        c0 = c1;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes).map_err(|e| Error::io(path, e)))
}

/// Writes a file atomically through a callback.
pub fn write_atomic_with(
    path: &Path,
    f: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> Result<()>,
) -> Result<()> {
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension().and_then(|e| e.to_str()).unwrap_or("")
    ));
    let file = std::fs::File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
    let res = f(&mut w).and_then(|_| {
        let file = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))
    });
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
}

/// Splits units into `n` shards of roughly equal bytes, never splitting a unit.
fn split_units(units: Vec<Unit>, n: usize) -> Vec<Vec<Spec>> {
    let total: u64 = units.iter().flatten().map(|s| s.bytes()).sum();
    let n = n.max(1).min(units.len().max(1));
    let target = total.div_ceil(n as u64).max(1);
    let mut shards: Vec<Vec<Spec>> = vec![Vec::new()];
    let mut acc = 0u64;
    let units_len = units.len();
    for (i, u) in units.into_iter().enumerate() {
        let b: u64 = u.iter().map(|s| s.bytes()).sum();
        let remaining_units = units_len - i;
        let remaining_shards = n - shards.len();
        if !shards.last().is_some_and(|s| s.is_empty())
            && (acc + b / 2 > target || remaining_units <= remaining_shards)
            && shards.len() < n
        {
            shards.push(Vec::new());
            acc = 0;
        }
        acc += b;
        if let Some(last) = shards.last_mut() {
            last.extend(u);
        }
    }
    shards
}

/// Writes shards, `config.json` and the tokenizer files of a K3-format model.
pub fn write_model(
    dir: &Path,
    config: &serde_json::Value,
    units: Vec<Unit>,
    shards: usize,
    seed: u64,
    ranks: &[Vec<u8>],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let shard_specs = split_units(units, shards);
    let total = shard_specs.len();
    let bar = crate::progress::bytes_bar(
        shard_specs.iter().flatten().map(|s| s.bytes()).sum(),
        "writing shards",
    );
    for (i, specs) in shard_specs.iter().enumerate() {
        let name = format!("model-{:05}-of-{:06}.safetensors", i + 1, total);
        let path = dir.join(&name);
        let entries: Vec<_> = specs
            .iter()
            .map(|s| (s.name.clone(), s.dtype, s.shape.clone()))
            .collect();
        let header = build_header(&entries);
        write_atomic_with(&path, |w| {
            w.write_all(&header).map_err(|e| Error::io(&path, e))?;
            for s in specs {
                write_tensor(w, s, seed, &path)?;
                bar.inc(s.bytes());
            }
            Ok(())
        })?;
    }
    bar.finish_and_clear();
    // The standard index, so hub clients can list the shards.
    let mut weight_map = serde_json::Map::new();
    let mut total_size = 0u64;
    for (i, specs) in shard_specs.iter().enumerate() {
        let name = format!("model-{:05}-of-{:06}.safetensors", i + 1, total);
        for s in specs {
            weight_map.insert(s.name.clone(), name.clone().into());
            total_size += s.bytes();
        }
    }
    let index =
        serde_json::json!({"metadata": {"total_size": total_size}, "weight_map": weight_map});
    write_atomic(
        &dir.join("model.safetensors.index.json"),
        index.to_string().as_bytes(),
    )?;
    let text = serde_json::to_string_pretty(config).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("config.json"), text.as_bytes())?;
    write_atomic(
        &dir.join("tiktoken.model"),
        tiktoken_model_text(ranks).as_bytes(),
    )?;
    let tc = tokenizer_config_json(ranks.len() as u32);
    let text = serde_json::to_string_pretty(&tc).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("tokenizer_config.json"), text.as_bytes())?;
    write_atomic(
        &dir.join("generation_config.json"),
        br#"{"max_length": 1048576}"#,
    )?;
    Ok(())
}

/// A K3-format config.json with the given dimensions (every other field as K3's).
#[allow(clippy::too_many_arguments)]
pub fn k3_style_config(
    hidden: usize,
    layers: usize,
    vocab: usize,
    intermediate: usize,
    experts: usize,
    top_k: usize,
    moe_inter: usize,
    latent: usize,
    mla: (usize, usize, usize, usize, usize, usize),
    kda: (usize, usize),
    block: usize,
    first_special: u32,
) -> serde_json::Value {
    let (heads, q_lora, kv_lora, nope, rope, v) = mla;
    let full: Vec<usize> = (1..=layers)
        .filter(|l| l % 4 == 0 || *l == layers)
        .collect();
    let kda_l: Vec<usize> = (1..=layers).filter(|l| !full.contains(l)).collect();
    let (bos, eos, pad) = (first_special, first_special + 2, first_special + 255);
    serde_json::json!({
        "architectures": ["KimiK3ForConditionalGeneration"],
        "model_type": "kimi_k3", "dtype": "bfloat16", "tie_word_embeddings": false,
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
        "text_config": {
            "model_type": "kimi_linear", "hidden_size": hidden, "num_hidden_layers": layers,
            "vocab_size": vocab, "max_position_embeddings": 1048576,
            "intermediate_size": intermediate, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "num_experts": experts, "num_experts_per_token": top_k, "num_shared_experts": 2,
            "moe_intermediate_size": moe_inter, "routed_expert_hidden_size": latent,
            "latent_moe_use_norm": true, "moe_router_activation_func": "sigmoid",
            "topk_method": "noaux_tc", "use_grouped_topk": true, "num_expert_group": 1,
            "topk_group": 1, "moe_renormalize": true, "routed_scaling_factor": 1.0,
            "hidden_act": "situ", "activation_situ_beta": 4.0,
            "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5,
            "num_attention_heads": heads, "num_key_value_heads": heads, "q_lora_rank": q_lora,
            "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
            "v_head_dim": v, "mla_use_nope": true, "mla_use_output_gate": true,
            "attn_res_block_size": block, "num_nextn_predict_layers": 0, "use_cache": true,
            "dtype": "bfloat16", "tie_word_embeddings": false,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
            "linear_attn_config": {
                "num_heads": kda.0, "head_dim": kda.1, "short_conv_kernel_size": 4,
                "use_full_rank_gate": true, "gate_lower_bound": -5.0,
                "kda_layers": kda_l, "full_attn_layers": full
            },
            "quantization_config": {
                "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"format": "mxfp4-pack-quantized",
                    "weights": {"num_bits": 4, "type": "float", "strategy": "group",
                        "group_size": 32, "symmetric": true, "dynamic": false,
                        "observer": "minmax", "scale_dtype": "torch.uint8"}}}
            }
        }
    })
}

/// E8M0 byte whose MXFP4 values have RMS about `1/sqrt(fan_in)`.
fn scale_center(fan_in: usize) -> u8 {
    // Random E2M1 codes have RMS ≈ 2.93.
    let target = 1.0 / (2.93 * (fan_in as f64).sqrt());
    (127.0 + target.log2().round()).clamp(2.0, 253.0) as u8
}

/// The tensors of a K3-format model, grouped into units, in file order.
pub fn model_units(
    cfg: &K3Config,
    prefix: &str,
    contiguous_experts: bool,
    fast: bool,
) -> Vec<Unit> {
    let t = cfg.text();
    let h = t.hidden_size;
    let bf = StDtype::BF16;
    let f32d = StDtype::F32;
    let lin = |name: String, out: usize, inp: usize| Spec {
        name,
        dtype: bf,
        shape: vec![out, inp],
        init: if fast {
            Init::Uniform(-1.7 / (inp as f32).sqrt(), 1.7 / (inp as f32).sqrt())
        } else {
            Init::Normal(1.0 / (inp as f32).sqrt())
        },
    };
    let norm = |name: String, n: usize, dtype: StDtype| Spec {
        name,
        dtype,
        shape: vec![n],
        init: Init::OnePlus(0.1),
    };
    let g = |s: &str| format!("{prefix}model.{s}");
    let mut units: Vec<Unit> = vec![vec![Spec {
        name: g("embed_tokens.weight"),
        dtype: bf,
        shape: vec![t.vocab_size, h],
        init: Init::Normal(1.0),
    }]];
    let la = &t.linear_attn_config;
    let kw = la.num_heads * la.head_dim;
    for (l, kind) in cfg.schedule.iter().enumerate() {
        let p = |s: &str| format!("{prefix}model.layers.{l}.{s}");
        let mut dense = vec![
            norm(p("input_layernorm.weight"), h, bf),
            norm(p("self_attention_res_norm.weight"), h, bf),
            lin(p("self_attention_res_proj.weight"), 1, h),
            norm(p("post_attention_layernorm.weight"), h, bf),
            norm(p("mlp_res_norm.weight"), h, bf),
            lin(p("mlp_res_proj.weight"), 1, h),
        ];
        match kind.attn {
            AttnKind::Kda => {
                let c = la.short_conv_kernel_size;
                dense.extend([
                    Spec {
                        name: p("self_attn.A_log"),
                        dtype: f32d,
                        shape: vec![la.head_dim],
                        init: Init::LogUniform(0.5, 4.0),
                    },
                    Spec {
                        name: p("self_attn.dt_bias"),
                        dtype: f32d,
                        shape: vec![kw],
                        init: Init::Normal(0.5),
                    },
                    Spec {
                        name: p("self_attn.q_conv1d.weight"),
                        dtype: f32d,
                        shape: vec![kw, 1, c],
                        init: Init::Normal(0.5),
                    },
                    Spec {
                        name: p("self_attn.k_conv1d.weight"),
                        dtype: f32d,
                        shape: vec![kw, 1, c],
                        init: Init::Normal(0.5),
                    },
                    Spec {
                        name: p("self_attn.v_conv1d.weight"),
                        dtype: f32d,
                        shape: vec![kw, 1, c],
                        init: Init::Normal(0.5),
                    },
                    norm(p("self_attn.o_norm.weight"), la.head_dim, f32d),
                    lin(p("self_attn.q_proj.weight"), kw, h),
                    lin(p("self_attn.k_proj.weight"), kw, h),
                    lin(p("self_attn.v_proj.weight"), kw, h),
                    lin(p("self_attn.g_proj.weight"), kw, h),
                    lin(p("self_attn.f_a_proj.weight"), la.head_dim, h),
                    lin(p("self_attn.f_b_proj.weight"), kw, la.head_dim),
                    lin(p("self_attn.b_proj.weight"), la.num_heads, h),
                    lin(p("self_attn.o_proj.weight"), h, kw),
                ]);
            }
            AttnKind::Mla => {
                let nh = t.num_attention_heads;
                let dq = t.qk_nope_head_dim + t.qk_rope_head_dim;
                dense.extend([
                    lin(p("self_attn.q_a_proj.weight"), t.q_lora_rank, h),
                    norm(p("self_attn.q_a_layernorm.weight"), t.q_lora_rank, bf),
                    lin(p("self_attn.q_b_proj.weight"), nh * dq, t.q_lora_rank),
                    lin(
                        p("self_attn.kv_a_proj_with_mqa.weight"),
                        t.kv_lora_rank + t.qk_rope_head_dim,
                        h,
                    ),
                    norm(p("self_attn.kv_a_layernorm.weight"), t.kv_lora_rank, bf),
                    lin(
                        p("self_attn.kv_b_proj.weight"),
                        nh * (t.qk_nope_head_dim + t.v_head_dim),
                        t.kv_lora_rank,
                    ),
                    lin(p("self_attn.g_proj.weight"), nh * t.v_head_dim, h),
                    lin(p("self_attn.o_proj.weight"), h, nh * t.v_head_dim),
                ]);
            }
        }
        match kind.ffn {
            FfnKind::Dense => {
                let i = t.intermediate_size;
                dense.extend([
                    lin(p("mlp.gate_proj.weight"), i, h),
                    lin(p("mlp.up_proj.weight"), i, h),
                    lin(p("mlp.down_proj.weight"), h, i),
                ]);
            }
            FfnKind::Moe => {
                let sw = cfg.shared_width();
                let r = t.routed_expert_hidden_size;
                dense.extend([
                    lin(p("block_sparse_moe.gate.weight"), t.num_experts, h),
                    Spec {
                        name: p("block_sparse_moe.gate.e_score_correction_bias"),
                        dtype: f32d,
                        shape: vec![t.num_experts],
                        init: Init::Normal(0.05),
                    },
                    lin(p("block_sparse_moe.routed_expert_down_proj.weight"), r, h),
                    norm(p("block_sparse_moe.routed_expert_norm.weight"), r, bf),
                    lin(p("block_sparse_moe.routed_expert_up_proj.weight"), h, r),
                    lin(p("block_sparse_moe.shared_experts.gate_proj.weight"), sw, h),
                    lin(p("block_sparse_moe.shared_experts.up_proj.weight"), sw, h),
                    lin(p("block_sparse_moe.shared_experts.down_proj.weight"), h, sw),
                ]);
            }
        }
        dense.sort_by(|a, b| a.name.cmp(&b.name));
        units.push(dense);
        if kind.ffn == FfnKind::Moe {
            // The expert run, in lexicographic order of the expert id (as K3's shards may be),
            // so nothing may compute an offset from the id.
            let mut ids: Vec<usize> = (0..t.num_experts).collect();
            ids.sort_by_key(|e| e.to_string());
            let shapes = cfg.expert_matrix_shapes();
            let parts = |e: usize| -> Vec<Spec> {
                let mut v = Vec::new();
                for (m, &(rows, cols)) in shapes.iter().enumerate() {
                    let w = ["w1", "w2", "w3"][m];
                    let base = p(&format!("block_sparse_moe.experts.{e}.{w}"));
                    v.push(Spec {
                        name: format!("{base}.weight_packed"),
                        dtype: StDtype::U8,
                        shape: vec![rows, cols / 2],
                        init: Init::Bytes,
                    });
                    v.push(Spec {
                        name: format!("{base}.weight_scale"),
                        dtype: StDtype::U8,
                        shape: vec![rows, cols / cfg.group_size],
                        init: Init::Scale(scale_center(cols)),
                    });
                }
                v
            };
            let run: Vec<Spec> = if contiguous_experts {
                ids.iter().flat_map(|&e| parts(e)).collect()
            } else {
                // Part-major: every expert's six tensors are scattered through the run.
                let all: Vec<Vec<Spec>> = ids.iter().map(|&e| parts(e)).collect();
                (0..6)
                    .flat_map(|k| all.iter().map(move |v| v[k].clone()))
                    .collect()
            };
            units.push(run);
        }
    }
    units.push(vec![
        norm(g("norm.weight"), h, bf),
        norm(g("output_attn_res_norm.weight"), h, bf),
        lin(g("output_attn_res_proj.weight"), 1, h),
        lin(format!("{prefix}lm_head.weight"), t.vocab_size, h),
    ]);
    // Vision tensors the loader must skip.
    units.push(vec![
        Spec {
            name: "vision_tower.patch_embed.proj.weight".into(),
            dtype: bf,
            shape: vec![16, 3, 2, 2],
            init: Init::Normal(0.1),
        },
        Spec {
            name: "mm_projector.proj.0.weight".into(),
            dtype: bf,
            shape: vec![h, 16],
            init: Init::Normal(0.1),
        },
    ]);
    units
}

/// Number of BPE merges in the nano vocabulary.
pub const NANO_MERGES: usize = 240;

/// The K3-nano config.json.
pub fn nano_config(first_special: u32) -> serde_json::Value {
    let vocab = first_special as usize + NUM_SPECIALS as usize;
    k3_style_config(
        96,
        10,
        vocab,
        160,
        16,
        4,
        96,
        64,
        (4, 48, 32, 16, 8, 16),
        (4, 16),
        4,
        first_special,
    )
}

/// Writes the K3-nano fixture into `dir`.
pub fn write_nano(dir: &Path, opts: &NanoOptions) -> Result<K3Config> {
    let ranks = train_ranks(NANO_MERGES);
    let config = nano_config(ranks.len() as u32);
    let cfg = K3Config::from_root(
        serde_json::from_value(config.clone()).map_err(|e| Error::Msg(e.to_string()))?,
    )?;
    let units = model_units(&cfg, "language_model.", opts.contiguous_experts, false);
    write_model(dir, &config, units, opts.shards.max(2), opts.seed, &ranks)?;
    Ok(cfg)
}

/// Writes the K3-slice benchmark fixture: K3's real per-layer dimensions with `layers` layers
/// and `experts` routed experts per MoE layer (vocabulary: the nano one).
pub fn write_slice(dir: &Path, layers: usize, experts: usize, seed: u64) -> Result<K3Config> {
    let ranks = train_ranks(NANO_MERGES);
    let first_special = ranks.len() as u32;
    let vocab = first_special as usize + NUM_SPECIALS as usize;
    let config = k3_style_config(
        7168,
        layers,
        vocab,
        33792,
        experts,
        16.min(experts),
        3072,
        3584,
        (96, 1536, 512, 128, 64, 128),
        (96, 128),
        12,
        first_special,
    );
    let cfg = K3Config::from_root(
        serde_json::from_value(config.clone()).map_err(|e| Error::Msg(e.to_string()))?,
    )?;
    let units = model_units(&cfg, "language_model.", true, true);
    let shards = (layers + 1).max(2);
    write_model(dir, &config, units, shards, seed, &ranks)?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{ExpertIndex, Inventory};

    #[test]
    fn nano_fixture_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = write_nano(dir.path(), &NanoOptions::default()).unwrap();
        let inv = Inventory::from_dir(dir.path()).unwrap();
        assert!(inv.shards.len() >= 2);
        assert_eq!(inv.skipped, 2);
        assert_eq!(inv.prefix, "language_model.");
        let ex = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
        assert_eq!(ex.count(), 9 * 16);
        assert_eq!(ex.contiguous_count(), ex.count());
        assert_eq!(ex.layout.span_bytes() as usize, cfg.expert_span_bytes());
        // every MoE layer's experts sit in one shard
        for l in cfg.moe_layers() {
            let s0 = ex.spans[l][0].shard;
            assert!(ex.spans[l].iter().all(|s| s.shard == s0));
        }
        // same seed, same bytes
        let dir2 = tempfile::tempdir().unwrap();
        write_nano(dir2.path(), &NanoOptions::default()).unwrap();
        for s in &inv.shards {
            let a = std::fs::read(dir.path().join(&s.file)).unwrap();
            let b = std::fs::read(dir2.path().join(&s.file)).unwrap();
            assert!(a == b, "{} differs between runs", s.file);
        }
    }

    #[test]
    fn scattered_experts_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let opts = NanoOptions {
            contiguous_experts: false,
            ..Default::default()
        };
        let cfg = write_nano(dir.path(), &opts).unwrap();
        let inv = Inventory::from_dir(dir.path()).unwrap();
        let ex = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
        assert_eq!(ex.contiguous_count(), 0);
    }
}
