//! `deltafin fixture`: which test/benchmark checkpoints the binary writes (K3's nano, medium,
//! slice and full shape; gpt-oss's tiny and full shape) and the call that writes each.

use std::path::PathBuf;

use clap::Subcommand;

use deltafin::models::k3::fixture::{
    write_k3_full, write_medium, write_nano, write_slice, NanoOptions,
};

/// Fixture kinds.
#[derive(Debug, Subcommand)]
pub enum FixtureKind {
    /// K3-nano: tiny, complete, every structural feature of K3.
    Nano {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of shards.
        #[arg(long, default_value_t = 4)]
        shards: usize,
        /// Scatter each expert's six tensors through the layer's run (not one read).
        #[arg(long)]
        scattered_experts: bool,
    },
    /// K3-medium: K3's structure with every part non-trivial (several KDA and MLA heads,
    /// latent MoE, multi-layer AttnRes blocks), small (a few MB).
    Medium {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of shards.
        #[arg(long, default_value_t = 3)]
        shards: usize,
    },
    /// K3-slice: real K3 per-layer dimensions, few layers and experts (several GB).
    Slice {
        /// Output directory.
        dir: PathBuf,
        /// Decoder layers.
        #[arg(long, default_value_t = 4)]
        layers: usize,
        /// Routed experts per MoE layer.
        #[arg(long, default_value_t = 32)]
        experts: usize,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// K3's full shape (real config, 96 shards, 82,432 experts at real sizes), written as sparse
    /// files: about 1.3 GB of disk for 1.56 TB of checkpoint. Outputs are meaningless.
    #[command(name = "k3-full")]
    K3Full {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Only the first N decoder layers (a full-shape layer prefix, for prefill checks).
        #[arg(long, default_value_t = deltafin::models::k3::fixture::K3_LAYERS)]
        layers: usize,
    },
    /// gpt-oss at its published shape (120b: 36 layers × 128 experts; or 20b), as sparse files:
    /// every large matrix a hole. Outputs are meaningless; counts, sizes and memory are real.
    #[command(name = "gpt-oss-full")]
    GptOssFull {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of shard files (the hub's 120b has 15, its 20b 3).
        #[arg(long, default_value_t = 15)]
        shards: usize,
        /// `120b` or `20b`.
        #[arg(long, default_value = "120b")]
        model: String,
        /// Only the first N decoder layers (a full-shape layer prefix).
        #[arg(long)]
        layers: Option<usize>,
    },
    /// A tiny gpt-oss in the hub's exact format (zero-based shard names, stacked MXFP4 experts).
    #[command(name = "gpt-oss-tiny")]
    GptOssTiny {
        /// Output directory.
        dir: PathBuf,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of shard files.
        #[arg(long, default_value_t = 3)]
        shards: usize,
        /// YaRN's original context (`initial_context_length`); the model holds 4× as many
        /// positions (harmony's system block alone takes about 200 of the tiny vocabulary's ids).
        #[arg(long, default_value_t = 64)]
        original_context: usize,
    },
    /// Qwen3-MoE in the hub's layout (one-based shard names cut at any tensor boundary, BF16
    /// experts one tensor per expert and matrix): the tiny shape or Qwen3-30B-A3B's, with any
    /// field changed.
    #[command(name = "qwen3-moe")]
    Qwen3Moe(Qwen3MoeArgs),
}

/// The shape of a Qwen3-MoE fixture.
#[derive(Debug, clap::Args)]
pub struct Qwen3MoeArgs {
    /// Output directory.
    dir: PathBuf,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of shard files.
    #[arg(long, default_value_t = 3)]
    shards: usize,
    /// `tiny` or `30b-a3b` (Qwen3-30B-A3B's published widths).
    #[arg(long, default_value = "tiny")]
    shape: String,
    /// Decoder layers (a layer prefix of a published shape).
    #[arg(long)]
    layers: Option<usize>,
    /// Residual width.
    #[arg(long)]
    hidden: Option<usize>,
    /// Query heads.
    #[arg(long)]
    heads: Option<usize>,
    /// Key/value heads.
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Head width.
    #[arg(long)]
    head_dim: Option<usize>,
    /// Experts per sparse layer.
    #[arg(long)]
    experts: Option<usize>,
    /// Experts per token.
    #[arg(long)]
    top_k: Option<usize>,
    /// Expert width.
    #[arg(long)]
    moe_inter: Option<usize>,
    /// `norm_topk_prob: false` (the top-k weights are not renormalised).
    #[arg(long)]
    no_norm_topk: bool,
    /// `decoder_sparse_step`.
    #[arg(long)]
    sparse_step: Option<usize>,
    /// `mlp_only_layers`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    mlp_only: Vec<usize>,
    /// `tie_word_embeddings: true`.
    #[arg(long)]
    tied: bool,
}

fn write_qwen3_moe(a: Qwen3MoeArgs) -> anyhow::Result<()> {
    use deltafin::models::qwen3_moe::fixture::{write_qwen3_moe, Qwen3MoeShape};
    let mut s = match a.shape.as_str() {
        "tiny" => Qwen3MoeShape::tiny(),
        "30b-a3b" => Qwen3MoeShape::qwen3_30b_a3b(),
        other => anyhow::bail!("--shape {other}: expected tiny or 30b-a3b"),
    };
    let set = |f: &mut usize, v: Option<usize>| *f = v.unwrap_or(*f);
    set(&mut s.layers, a.layers);
    set(&mut s.hidden, a.hidden);
    set(&mut s.heads, a.heads);
    set(&mut s.kv_heads, a.kv_heads);
    set(&mut s.head_dim, a.head_dim);
    set(&mut s.experts, a.experts);
    set(&mut s.top_k, a.top_k);
    set(&mut s.moe_inter, a.moe_inter);
    set(&mut s.sparse_step, a.sparse_step);
    s.norm_topk_prob &= !a.no_norm_topk;
    s.mlp_only = a.mlp_only;
    s.tied |= a.tied;
    let t0 = std::time::Instant::now();
    let cfg = write_qwen3_moe(&a.dir, &s, a.seed, a.shards)?;
    eprintln!(
        "wrote Qwen3-MoE ({} layers, {} experts) to {} in {:.1} s",
        cfg.num_hidden_layers,
        cfg.num_experts,
        a.dir.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Writes the fixture `kind` names.
pub fn write(kind: FixtureKind) -> anyhow::Result<()> {
    match kind {
        FixtureKind::Nano {
            dir,
            seed,
            shards,
            scattered_experts,
        } => {
            let opts = NanoOptions {
                seed,
                shards,
                contiguous_experts: !scattered_experts,
            };
            write_nano(&dir, &opts)?;
            eprintln!("wrote K3-nano to {}", dir.display());
        }
        FixtureKind::Medium { dir, seed, shards } => {
            write_medium(&dir, seed, shards)?;
            eprintln!("wrote K3-medium to {}", dir.display());
        }
        FixtureKind::Slice {
            dir,
            layers,
            experts,
            seed,
        } => {
            write_slice(&dir, layers, experts, seed)?;
            eprintln!(
                "wrote K3-slice ({layers} layers, {experts} experts) to {}",
                dir.display()
            );
        }
        FixtureKind::GptOssFull {
            dir,
            seed,
            shards,
            model,
            layers,
        } => {
            use deltafin::models::gpt_oss::fixture::{write_gpt_oss_sparse, GptOssShape};
            let mut shape = match model.as_str() {
                "120b" => GptOssShape::gpt_oss_120b(),
                "20b" => GptOssShape::gpt_oss_20b(),
                other => anyhow::bail!("--model {other}: expected 120b or 20b"),
            };
            if let Some(n) = layers {
                if n == 0 || n > shape.layers {
                    anyhow::bail!("--layers {n}: expected 1..={}", shape.layers);
                }
                shape.layers = n;
            }
            let t0 = std::time::Instant::now();
            write_gpt_oss_sparse(&dir, &shape, seed, shards)?;
            eprintln!(
                "wrote the full-shape gpt-oss-{model} fixture (sparse) to {} in {:.1} s",
                dir.display(),
                t0.elapsed().as_secs_f64()
            );
        }
        FixtureKind::GptOssTiny {
            dir,
            seed,
            shards,
            original_context,
        } => {
            use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
            let shape = GptOssShape {
                original_context: original_context.max(1),
                ..GptOssShape::tiny()
            };
            write_gpt_oss(&dir, &shape, seed, shards)?;
            eprintln!("wrote gpt-oss-tiny to {}", dir.display());
        }
        FixtureKind::Qwen3Moe(a) => write_qwen3_moe(a)?,
        FixtureKind::K3Full { dir, seed, layers } => {
            let t0 = std::time::Instant::now();
            write_k3_full(&dir, seed, layers)?;
            eprintln!(
                "wrote the full-shape K3 fixture (sparse) to {} in {:.1} s",
                dir.display(),
                t0.elapsed().as_secs_f64()
            );
        }
    }
    Ok(())
}
