//! gpt-oss checkpoints in the hub's exact format, written from a seed: `config.json` as
//! published (both top-k spellings, `layer_types`, YaRN with `truncate: false`,
//! `quantization_config.quant_method: "mxfp4"`), shards named as the hub names them
//! (`model-00000-of-0000N.safetensors` … `model-0000N-of-0000N`, zero-based: N + 1 files) with
//! `model.safetensors.index.json`, BF16 dense tensors, and each layer's experts stacked as MXFP4
//! `_blocks` `[E, rows, cols/32, 16]` / `_scales` `[E, rows, cols/32]` with BF16 `_bias`.
//! Files are written atomically. Owns no model math.

use std::path::Path;

use safetensors::Dtype;

use crate::checkpoint::fixture_writer::{write_shards, Fill, Tensor};
use crate::fsio::atomic::write_atomic;
use crate::runtime::fixtures::{Fixture, FixtureArgs, FixtureOption};
use crate::{Error, Result};

use super::config::GptOssConfig;
pub use super::fixture_tokenizer::write_tokenizer_json;
use super::names::{self, EXPERT_PARTS};

/// The dimensions of a fixture.
#[derive(Debug, Clone)]
pub struct GptOssShape {
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden: usize,
    /// Expert FFN width.
    pub inter: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Experts per layer.
    pub experts: usize,
    /// Top-k.
    pub top_k: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Sliding window.
    pub window: usize,
    /// YaRN's pre-training context (the factor is 4 on it).
    pub original_context: usize,
    /// Rotary base.
    pub rope_theta: f64,
    /// YaRN's factor (the context is `original_context × factor`).
    pub factor: f64,
    /// `<|return|>` (the config's eos), and the pad and bos ids.
    pub eos: usize,
    /// Pad id.
    pub pad: usize,
    /// Bos id.
    pub bos: usize,
}

impl GptOssShape {
    /// A tiny gpt-oss for tests: 4 layers (sliding, full, …), window 8, 8 experts, top-4.
    pub fn tiny() -> Self {
        GptOssShape {
            layers: 4,
            hidden: 64,
            inter: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            experts: 8,
            top_k: 4,
            vocab: 512,
            window: 8,
            original_context: 64,
            rope_theta: 10000.0,
            factor: 4.0,
            eos: 511,
            pad: 510,
            bos: 509,
        }
    }

    /// gpt-oss-120b's published shape: 36 layers, 128 experts, top-4, 201,088 ids.
    pub fn gpt_oss_120b() -> Self {
        GptOssShape {
            layers: 36,
            experts: 128,
            ..Self::gpt_oss_20b()
        }
    }

    /// gpt-oss-20b's published shape: 24 layers, 32 experts, top-4.
    pub fn gpt_oss_20b() -> Self {
        GptOssShape {
            layers: 24,
            hidden: 2880,
            inter: 2880,
            heads: 64,
            kv_heads: 8,
            head_dim: 64,
            experts: 32,
            top_k: 4,
            vocab: 201088,
            window: 128,
            original_context: 4096,
            rope_theta: 150000.0,
            factor: 32.0,
            eos: 200002,
            pad: 199999,
            bos: 199998,
        }
    }

    /// The config.json of this shape, with every field the published one has.
    pub fn config(&self) -> serde_json::Value {
        let types: Vec<&str> = (0..self.layers)
            .map(|l| {
                if l.is_multiple_of(2) {
                    "sliding_attention"
                } else {
                    "full_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["GptOssForCausalLM"],
            "attention_bias": true,
            "attention_dropout": 0.0,
            "eos_token_id": self.eos,
            "experts_per_token": self.top_k,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initial_context_length": self.original_context,
            "initializer_range": 0.02,
            "intermediate_size": self.inter,
            "layer_types": types,
            "max_position_embeddings": (self.original_context as f64 * self.factor) as usize,
            "model_type": "gpt_oss",
            "num_attention_heads": self.heads,
            "num_experts_per_tok": self.top_k,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "num_local_experts": self.experts,
            "output_router_logits": false,
            "pad_token_id": self.pad,
            "quantization_config": {
                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                           "model.embed_tokens", "lm_head"],
                "quant_method": "mxfp4"
            },
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "beta_fast": 32.0, "beta_slow": 1.0, "factor": self.factor,
                "original_max_position_embeddings": self.original_context,
                "rope_type": "yarn", "truncate": false
            },
            "rope_theta": self.rope_theta,
            "router_aux_loss_coef": 0.9,
            "sliding_window": self.window,
            "swiglu_limit": 7.0,
            "tie_word_embeddings": false,
            "torch_dtype": "bfloat16",
            "use_cache": true,
            "vocab_size": self.vocab
        })
    }
}

/// Whether a tensor of this name is stored as bytes (MXFP4 codes and scales).
fn shape_is_u8(name: &str) -> bool {
    name.ends_with("_blocks") || name.ends_with("_scales")
}

/// Every tensor of the model, in the order the hub's shards list them (layer by layer). Sparse:
/// the large matrices are holes; norms, routers, biases, sinks and the embedding's first 4,096
/// rows hold data, so positions route differently.
fn tensors(s: &GptOssShape, sparse: bool) -> Vec<Tensor> {
    let big = |f: Fill| if sparse { Fill::Hole } else { f };
    let t = |name: String, shape: Vec<usize>, fill| Tensor {
        dtype: match fill {
            Fill::Codes | Fill::Scales(..) => Dtype::U8,
            Fill::Hole if shape_is_u8(&name) => Dtype::U8,
            _ => Dtype::BF16,
        },
        name,
        shape,
        fill,
    };
    let (h, qd, kd) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let w = |fan_in: usize| Fill::Normal(1.0 / (fan_in as f32).sqrt());
    let embed = match sparse {
        true => Fill::LeadingRows(4096, 1.0),
        false => Fill::Normal(1.0),
    };
    let mut v = vec![t(names::EMBED.into(), vec![s.vocab, h], embed)];
    for l in 0..s.layers {
        let n = |x: &str| names::layer(l, x);
        v.push(t(
            n("input_layernorm.weight"),
            vec![h],
            Fill::AroundOne(0.1),
        ));
        for (p, rows, cols) in [("q_proj", qd, h), ("k_proj", kd, h), ("v_proj", kd, h)] {
            v.push(t(
                n(&format!("self_attn.{p}.weight")),
                vec![rows, cols],
                w(cols),
            ));
            v.push(t(
                n(&format!("self_attn.{p}.bias")),
                vec![rows],
                Fill::Normal(0.1),
            ));
        }
        v.push(t(n("self_attn.o_proj.weight"), vec![h, qd], big(w(qd))));
        v.push(t(n("self_attn.o_proj.bias"), vec![h], Fill::Normal(0.1)));
        v.push(t(n("self_attn.sinks"), vec![s.heads], Fill::Normal(1.0)));
        v.push(t(
            n("post_attention_layernorm.weight"),
            vec![h],
            Fill::AroundOne(0.1),
        ));
        v.push(t(n("mlp.router.weight"), vec![s.experts, h], w(h)));
        v.push(t(n("mlp.router.bias"), vec![s.experts], Fill::Normal(0.1)));
        let e = s.experts;
        let (gu, i) = (2 * s.inter, s.inter);
        let parts = [
            (vec![e, gu, h / 32, 16], Fill::Codes),
            (vec![e, gu, h / 32], Fill::Scales(124, 3)),
            (vec![e, gu], Fill::Normal(0.1)),
            (vec![e, h, i / 32, 16], Fill::Codes),
            (vec![e, h, i / 32], Fill::Scales(118, 3)),
            (vec![e, h], Fill::Normal(0.1)),
        ];
        for (p, (shape, fill)) in EXPERT_PARTS.iter().zip(parts) {
            v.push(t(n(&format!("mlp.experts.{p}")), shape, big(fill)));
        }
    }
    v.push(t(names::NORM.into(), vec![h], Fill::AroundOne(0.1)));
    v.push(t(names::LM_HEAD.into(), vec![s.vocab, h], big(w(h))));
    v
}

/// Writes a gpt-oss checkpoint of `shape` into `dir` in `files` shards (named zero-based, as
/// the hub names gpt-oss's; one file is `model.safetensors`), returning its validated config.
pub fn write_gpt_oss(
    dir: &Path,
    shape: &GptOssShape,
    seed: u64,
    files: usize,
) -> Result<GptOssConfig> {
    write(dir, shape, seed, files, false)
}

/// `write_gpt_oss` as sparse files: every large matrix a hole (zeros), so a full-shape
/// checkpoint (gpt-oss-120b: 65 GB) takes a few hundred MB of disk; outputs are meaningless,
/// counts, sizes and memory are real.
pub fn write_gpt_oss_sparse(
    dir: &Path,
    shape: &GptOssShape,
    seed: u64,
    files: usize,
) -> Result<GptOssConfig> {
    write(dir, shape, seed, files, true)
}

fn write(
    dir: &Path,
    shape: &GptOssShape,
    seed: u64,
    files: usize,
    sparse: bool,
) -> Result<GptOssConfig> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let all = tensors(shape, sparse);
    // A boundary may fall inside a layer's dense tensors (as in the hub's gpt-oss-20b, whose
    // layer 18 starts in one file and ends in the next) but never between a layer's six expert
    // tensors, as the hub's files never split them.
    let keep = |n: &str| n.contains(".mlp.experts.") && !n.ends_with(EXPERT_PARTS[0]);
    // Named zero-based, as the hub names gpt-oss's (N + 1 files).
    let name = |i: usize, last: usize| format!("model-{i:05}-of-{last:05}.safetensors");
    write_shards(dir, &all, seed, files, &keep, &name)?;
    let config = shape.config();
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("config.json"), text.as_bytes())?;
    write_atomic(
        &dir.join("generation_config.json"),
        format!(
            r#"{{"bos_token_id": {}, "do_sample": true, "eos_token_id": [{}], "pad_token_id": {}}}"#,
            shape.bos, shape.eos, shape.pad
        )
        .as_bytes(),
    )?;
    write_tokenizer_json(dir, shape)?;
    GptOssConfig::from_file(&dir.join("config.json"))
}

fn tiny_fixture(dir: &Path, a: &FixtureArgs) -> Result<String> {
    let shape = GptOssShape {
        original_context: a.number("original-context", 64usize)?.max(1),
        ..GptOssShape::tiny()
    };
    write_gpt_oss(dir, &shape, a.number("seed", 0)?, a.number("shards", 3)?)?;
    Ok(format!("wrote gpt-oss-tiny to {}", dir.display()))
}

fn full_fixture(dir: &Path, a: &FixtureArgs) -> Result<String> {
    let model = a.text("model").unwrap_or("120b");
    let mut shape = match model {
        "120b" => GptOssShape::gpt_oss_120b(),
        "20b" => GptOssShape::gpt_oss_20b(),
        other => return Err(Error::Msg(format!("--model {other}: expected 120b or 20b"))),
    };
    if let Some(n) = a.maybe::<usize>("layers")? {
        if n == 0 || n > shape.layers {
            return Err(Error::Msg(format!(
                "--layers {n}: expected 1..={}",
                shape.layers
            )));
        }
        shape.layers = n;
    }
    let t0 = std::time::Instant::now();
    write_gpt_oss_sparse(dir, &shape, a.number("seed", 0)?, a.number("shards", 15)?)?;
    Ok(format!(
        "wrote the full-shape gpt-oss-{model} fixture (sparse) to {} in {:.1} s",
        dir.display(),
        t0.elapsed().as_secs_f64()
    ))
}

const fn opt(name: &'static str, value: Option<&'static str>, help: &'static str) -> FixtureOption {
    FixtureOption { name, value, help }
}

/// gpt-oss's fixtures (`deltafin fixture gpt-oss-tiny|gpt-oss-full`).
pub static FIXTURES: &[Fixture] = &[
    Fixture {
        name: "gpt-oss-tiny",
        about: "a tiny gpt-oss in the hub's exact format (zero-based shard names, stacked MXFP4 experts)",
        options: &[
            opt("seed", Some("N"), "seed (0)"),
            opt("shards", Some("N"), "number of shard files (3)"),
            opt(
                "original-context",
                Some("N"),
                "YaRN's original context; the model holds 4x as many positions (64)",
            ),
        ],
        write: tiny_fixture,
    },
    Fixture {
        name: "gpt-oss-full",
        about: "gpt-oss at its published shape (120b: 36 layers x 128 experts; or 20b) as sparse files: outputs meaningless, counts, sizes and memory real",
        options: &[
            opt("seed", Some("N"), "seed (0)"),
            opt("shards", Some("N"), "number of shard files (the hub's 120b has 15, its 20b 3; 15)"),
            opt("model", Some("120b|20b"), "which published shape (120b)"),
            opt("layers", Some("N"), "only the first N decoder layers"),
        ],
        write: full_fixture,
    },
];
