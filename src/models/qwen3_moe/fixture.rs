//! Qwen3-MoE checkpoints in the hub's layout, written from a seed: `config.json` with every
//! field the published ones have, BF16 tensors one per expert and matrix, shards named as the
//! hub names them (`model-00001-of-0000N.safetensors`, one-based) and cut at any tensor
//! boundary by size, as transformers' `save_pretrained` cuts them (so an expert's three
//! tensors may straddle two files), `model.safetensors.index.json`, `generation_config.json`
//! and a `tokenizer.json` (a small byte-level BPE trained on the built-in corpus with Qwen2's
//! split pattern, or, for a published shape, padded to Qwen's 151,643 ranks; the specials
//! `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, `<think>`, `</think>` follow the ranks as in
//! Qwen's). Files are written atomically. Owns no model math.

use std::path::Path;

use safetensors::Dtype;

use crate::chat::chatml::{END_OF_TEXT, IM_END, IM_START, THINK, THINK_END};
use crate::checkpoint::fixture_writer::{write_shards, Fill, Tensor};
use crate::checkpoint::tiktoken_fixture::{pad_ranks, train_ranks};
use crate::fsio::atomic::write_atomic;
use crate::runtime::fixtures::{Fixture, FixtureArgs, FixtureOption};
use crate::{Error, Result};

use super::config::Qwen3MoeConfig;
use super::names::{self, EXPERT_MATRICES};

/// Qwen2's (and Qwen3's) pre-tokenizer split pattern.
pub const QWEN2_PATTERN: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|",
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The specials after the ranks, in Qwen's order (`<|im_end|>` is the eos).
const SPECIALS: [&str; 5] = [END_OF_TEXT, IM_START, IM_END, THINK, THINK_END];

/// The dimensions of a fixture.
#[derive(Debug, Clone)]
pub struct Qwen3MoeShape {
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden: usize,
    /// Dense MLP width (`mlp_only_layers`).
    pub inter: usize,
    /// Expert width.
    pub moe_inter: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Experts per sparse layer.
    pub experts: usize,
    /// Top-k.
    pub top_k: usize,
    /// Embedding rows (the tokenizer's ids, padded).
    pub vocab: usize,
    /// BPE ranks of the tokenizer (the specials follow them).
    pub ranks: usize,
    /// Renormalise the top-k weights.
    pub norm_topk_prob: bool,
    /// Every `sparse_step`-th layer is sparse.
    pub sparse_step: usize,
    /// Layers with a dense MLP.
    pub mlp_only: Vec<usize>,
    /// lm_head is the embedding.
    pub tied: bool,
    /// Rotary base.
    pub rope_theta: f64,
    /// Trained context.
    pub context: usize,
}

impl Qwen3MoeShape {
    /// A small shape for tests: 4 layers, 16 experts top-4, a 1,024-id vocabulary.
    pub fn tiny() -> Self {
        Qwen3MoeShape {
            layers: 4,
            hidden: 64,
            inter: 96,
            moe_inter: 32,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            experts: 16,
            top_k: 4,
            vocab: 1024,
            ranks: 1000,
            norm_topk_prob: true,
            sparse_step: 1,
            mlp_only: Vec::new(),
            tied: false,
            rope_theta: 1_000_000.0,
            context: 4096,
        }
    }

    /// Qwen3-30B-A3B's published shape: 48 layers, hidden 2,048, 32 q / 4 kv heads of 128,
    /// 128 experts of 768 (top 8), 151,936 embedding rows.
    pub fn qwen3_30b_a3b() -> Self {
        Qwen3MoeShape {
            layers: 48,
            hidden: 2048,
            inter: 6144,
            moe_inter: 768,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            experts: 128,
            top_k: 8,
            vocab: 151_936,
            ranks: 151_643,
            norm_topk_prob: true,
            sparse_step: 1,
            mlp_only: Vec::new(),
            tied: false,
            rope_theta: 1_000_000.0,
            context: 40_960,
        }
    }

    /// The config.json of this shape, with every field the published one has.
    pub fn config(&self) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": self.ranks,
            "decoder_sparse_step": self.sparse_step,
            "eos_token_id": self.ranks + 2,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden,
            "initializer_range": 0.02,
            "intermediate_size": self.inter,
            "max_position_embeddings": self.context,
            "max_window_layers": self.layers,
            "mlp_only_layers": self.mlp_only,
            "model_type": "qwen3_moe",
            "moe_intermediate_size": self.moe_inter,
            "norm_topk_prob": self.norm_topk_prob,
            "num_attention_heads": self.heads,
            "num_experts": self.experts,
            "num_experts_per_tok": self.top_k,
            "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads,
            "output_router_logits": false,
            "rms_norm_eps": 1e-06,
            "rope_scaling": null,
            "rope_theta": self.rope_theta,
            "router_aux_loss_coef": 0.001,
            "sliding_window": null,
            "tie_word_embeddings": self.tied,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": true,
            "use_sliding_window": false,
            "vocab_size": self.vocab
        })
    }

    fn is_moe(&self, l: usize) -> bool {
        !self.mlp_only.contains(&l) && (l + 1).is_multiple_of(self.sparse_step)
    }
}

/// Every tensor of the model in the order transformers saves them.
fn tensors(s: &Qwen3MoeShape) -> Vec<Tensor> {
    let t = |name: String, shape: Vec<usize>, fill| Tensor {
        name,
        dtype: Dtype::BF16,
        shape,
        fill,
    };
    let (h, d) = (s.hidden, s.head_dim);
    let (qd, kd) = (s.heads * d, s.kv_heads * d);
    let w = |fan_in: usize| Fill::Normal(1.0 / (fan_in as f32).sqrt());
    let mut v = vec![t(names::EMBED.into(), vec![s.vocab, h], Fill::Normal(1.0))];
    for l in 0..s.layers {
        let n = |x: &str| names::layer(l, x);
        for (p, rows, cols) in [("q", qd, h), ("k", kd, h), ("v", kd, h), ("o", h, qd)] {
            v.push(t(
                n(&format!("self_attn.{p}_proj.weight")),
                vec![rows, cols],
                w(cols),
            ));
        }
        v.push(t(
            n("self_attn.q_norm.weight"),
            vec![d],
            Fill::AroundOne(0.1),
        ));
        v.push(t(
            n("self_attn.k_norm.weight"),
            vec![d],
            Fill::AroundOne(0.1),
        ));
        if s.is_moe(l) {
            // A spread router, so positions pick different experts.
            v.push(t(
                n("mlp.gate.weight"),
                vec![s.experts, h],
                Fill::Normal(0.5),
            ));
            for e in 0..s.experts {
                for m in EXPERT_MATRICES {
                    let shape = match m {
                        "down_proj" => vec![h, s.moe_inter],
                        _ => vec![s.moe_inter, h],
                    };
                    let fill = w(shape[1]);
                    v.push(t(names::expert(l, e, m), shape, fill));
                }
            }
        } else {
            for (m, rows, cols) in [
                ("gate", s.inter, h),
                ("up", s.inter, h),
                ("down", h, s.inter),
            ] {
                v.push(t(
                    n(&format!("mlp.{m}_proj.weight")),
                    vec![rows, cols],
                    w(cols),
                ));
            }
        }
        v.push(t(
            n("input_layernorm.weight"),
            vec![h],
            Fill::AroundOne(0.1),
        ));
        v.push(t(
            n("post_attention_layernorm.weight"),
            vec![h],
            Fill::AroundOne(0.1),
        ));
    }
    v.push(t(names::NORM.into(), vec![h], Fill::AroundOne(0.1)));
    if !s.tied {
        v.push(t(names::LM_HEAD.into(), vec![s.vocab, h], w(h)));
    }
    v
}

/// Writes a Qwen3-MoE checkpoint of `shape` into `dir` in `files` shards (one file is
/// `model.safetensors`), returning its validated config.
pub fn write_qwen3_moe(
    dir: &Path,
    shape: &Qwen3MoeShape,
    seed: u64,
    files: usize,
) -> Result<Qwen3MoeConfig> {
    let name = |i: usize, last: usize| format!("model-{:05}-of-{:05}.safetensors", i + 1, last + 1);
    write_shards(dir, &tensors(shape), seed, files, &|_| false, &name)?;
    let text =
        serde_json::to_string_pretty(&shape.config()).map_err(|e| Error::Msg(e.to_string()))?;
    write_atomic(&dir.join("config.json"), text.as_bytes())?;
    let (eot, end) = (shape.ranks, shape.ranks + 2);
    write_atomic(
        &dir.join("generation_config.json"),
        format!(r#"{{"bos_token_id": {eot}, "do_sample": true, "eos_token_id": [{end}, {eot}], "pad_token_id": {eot}, "temperature": 0.6, "top_k": 20, "top_p": 0.95}}"#)
            .as_bytes(),
    )?;
    write_tokenizer_json(dir, shape)?;
    Qwen3MoeConfig::from_file(&dir.join("config.json"))
}

/// The shape's `tokenizer.json`: byte-level BPE trained on the built-in corpus (padded with
/// random tokens up to `ranks`), Qwen2's split pattern, the specials after the ranks.
pub fn write_tokenizer_json(dir: &Path, shape: &Qwen3MoeShape) -> Result<()> {
    if shape.ranks + SPECIALS.len() > shape.vocab || shape.ranks < 300 {
        return Err(Error::Msg(format!(
            "a tokenizer of {} ranks and {} specials does not fit {} ids",
            shape.ranks,
            SPECIALS.len(),
            shape.vocab
        )));
    }
    let mut ranks = pad_ranks(train_ranks(shape.ranks.min(4096) - 256), shape.ranks, 1);
    ranks.truncate(shape.ranks);
    let specials = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| (s.to_string(), (shape.ranks + i) as u32))
        .collect();
    let tk = crate::tokenizer::Tokenizer::new(ranks, specials, QWEN2_PATTERN)?.to_hf()?;
    let text = tk
        .to_string(false)
        .map_err(|e| Error::Msg(format!("tokenizer.json: {e}")))?;
    write_atomic(&dir.join("tokenizer.json"), text.as_bytes())
}

/// `deltafin fixture qwen3-moe`: the tiny shape or Qwen3-30B-A3B's, with any field changed.
fn fixture(dir: &Path, a: &FixtureArgs) -> Result<String> {
    let mut s = match a.text("shape").unwrap_or("tiny") {
        "tiny" => Qwen3MoeShape::tiny(),
        "30b-a3b" => Qwen3MoeShape::qwen3_30b_a3b(),
        other => {
            return Err(Error::Msg(format!(
                "--shape {other}: expected tiny or 30b-a3b"
            )))
        }
    };
    for (name, field) in [
        ("layers", &mut s.layers),
        ("hidden", &mut s.hidden),
        ("heads", &mut s.heads),
        ("kv-heads", &mut s.kv_heads),
        ("head-dim", &mut s.head_dim),
        ("experts", &mut s.experts),
        ("top-k", &mut s.top_k),
        ("moe-inter", &mut s.moe_inter),
        ("sparse-step", &mut s.sparse_step),
    ] {
        *field = a.number(name, *field)?;
    }
    s.norm_topk_prob &= !a.flag("no-norm-topk");
    s.mlp_only = a.numbers("mlp-only")?;
    s.tied |= a.flag("tied");
    let t0 = std::time::Instant::now();
    let cfg = write_qwen3_moe(dir, &s, a.number("seed", 0)?, a.number("shards", 3)?)?;
    Ok(format!(
        "wrote Qwen3-MoE ({} layers, {} experts) to {} in {:.1} s",
        cfg.num_hidden_layers,
        cfg.num_experts,
        dir.display(),
        t0.elapsed().as_secs_f64()
    ))
}

const fn opt(name: &'static str, value: Option<&'static str>, help: &'static str) -> FixtureOption {
    FixtureOption { name, value, help }
}

/// Qwen3-MoE's fixture.
pub static FIXTURES: &[Fixture] = &[Fixture {
    name: "qwen3-moe",
    about: "Qwen3-MoE in the hub's layout (one-based shard names cut at any tensor boundary, BF16 experts one tensor per expert and matrix)",
    options: &[
        opt("seed", Some("N"), "seed (0)"),
        opt("shards", Some("N"), "number of shard files (3)"),
        opt("shape", Some("tiny|30b-a3b"), "the base shape (tiny)"),
        opt("layers", Some("N"), "decoder layers (a prefix of a published shape)"),
        opt("hidden", Some("N"), "residual width"),
        opt("heads", Some("N"), "query heads"),
        opt("kv-heads", Some("N"), "key/value heads"),
        opt("head-dim", Some("N"), "head width"),
        opt("experts", Some("N"), "experts per sparse layer"),
        opt("top-k", Some("N"), "experts per token"),
        opt("moe-inter", Some("N"), "expert width"),
        opt("sparse-step", Some("N"), "decoder_sparse_step"),
        opt("mlp-only", Some("L,..."), "mlp_only_layers"),
        opt("no-norm-topk", None, "norm_topk_prob: false"),
        opt("tied", None, "tie_word_embeddings: true"),
    ],
    write: fixture,
}];
