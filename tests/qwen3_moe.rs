//! Qwen3-MoE against candle-transformers' `qwen3_moe` (written by others, run here as a
//! reference through its public API, never copied) on checkpoints in the hub's layout from
//! several seeds and shapes: first-step logits within 1e-4 of the reference's largest logit
//! and greedy continuations equal, with the experts streamed through the tiered store (one run
//! with a RAM tier far smaller than the experts, one with an expert split across two shard
//! files). The transformers check is `scripts/qwen3_moe_reference.py` in `.ci/run`.

use std::path::Path;

use candle::{DType, Device, Tensor};
use candle_transformers::models::qwen3_moe::{Config, ModelForCausalLM};
use deltafin::checkpoint::Inventory;
use deltafin::experts::TieredOptions;
use deltafin::models::qwen3_moe::fixture::{write_qwen3_moe, Qwen3MoeShape};
use deltafin::models::qwen3_moe::{names, Qwen3MoeModel};

/// The reference's last-position logits and its greedy continuation of `prompt`.
fn reference(dir: &Path, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>) {
    let cfg: Config =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let inv = Inventory::from_dir(dir).unwrap();
    let files: Vec<_> = (0..inv.shards.len()).map(|i| inv.shard_path(i)).collect();
    // SAFETY: the fixture's files are not modified while mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::F32, &Device::Cpu).unwrap()
    };
    let mut m = ModelForCausalLM::new(&cfg, vb).unwrap();
    let run = |m: &mut ModelForCausalLM, ids: &[u32], offset: usize| -> Vec<f32> {
        let x = Tensor::new(ids, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        m.forward(&x, offset)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let first = run(&mut m, prompt, 0);
    let (mut logits, mut out, mut pos) = (first.clone(), Vec::new(), prompt.len());
    for _ in 0..steps {
        let next = deltafin::runtime::generate::argmax(&logits);
        out.push(next);
        logits = run(&mut m, &[next], pos);
        pos += 1;
    }
    (first, out)
}

/// Ours, the same way, with the experts behind a RAM tier of `ram` bytes.
fn ours(dir: &Path, prompt: &[u32], steps: usize, ram: usize) -> (Vec<f32>, Vec<u32>) {
    let opts = TieredOptions {
        ram_budget: ram,
        ..Default::default()
    };
    let m = Qwen3MoeModel::open(dir, &opts).unwrap();
    let mut s = m.new_state();
    let first = m.forward(prompt, &mut s).unwrap();
    let (mut logits, mut out) = (first.clone(), Vec::new());
    for _ in 0..steps {
        let next = deltafin::runtime::generate::argmax(&logits);
        out.push(next);
        logits = m.forward(&[next], &mut s).unwrap();
    }
    (first, out)
}

fn prompt(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 131 + seed * 977 + 7) % vocab)
        .collect()
}

/// Checks one checkpoint: logits within 1e-4 of the reference's scale, greedy ids equal.
fn check(shape: &Qwen3MoeShape, seed: u64, shards: usize, ram: usize) {
    let d = tempfile::tempdir().unwrap();
    write_qwen3_moe(d.path(), shape, seed, shards).unwrap();
    let p = prompt(23, seed as u32, shape.ranks as u32);
    let (want, want_ids) = reference(d.path(), &p, 8);
    let (got, got_ids) = ours(d.path(), &p, 8, ram);
    let scale = want.iter().fold(0f32, |a, b| a.max(b.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0f32, |a, (x, y)| a.max((x - y).abs()));
    assert!(
        worst <= 1e-4 * scale,
        "seed {seed}: logits differ by {worst} (largest |logit| {scale})"
    );
    assert_eq!(
        got_ids, want_ids,
        "seed {seed}: greedy continuations differ"
    );
}

#[test]
fn tiny_shape_matches_candle_transformers_for_three_seeds() {
    for seed in 0..3 {
        check(&Qwen3MoeShape::tiny(), seed, 3, usize::MAX / 4);
    }
}

#[test]
fn a_wider_shape_without_renormalised_weights_matches_with_a_small_expert_tier() {
    let shape = Qwen3MoeShape {
        layers: 3,
        hidden: 128,
        heads: 8,
        kv_heads: 2,
        head_dim: 32,
        experts: 32,
        top_k: 8,
        moe_inter: 64,
        norm_topk_prob: false,
        tied: true,
        ..Qwen3MoeShape::tiny()
    };
    // Room for 6 of the 96 experts: nearly every routed expert is read from the shards.
    let expert = 3 * 2 * shape.hidden * shape.moe_inter;
    check(&shape, 7, 5, 6 * expert);
}

#[test]
fn an_expert_split_across_two_shard_files_is_read_whole() {
    // Cut at tensor boundaries into many files, several experts straddle two of them.
    let d = tempfile::tempdir().unwrap();
    let shape = Qwen3MoeShape::tiny();
    let cfg = write_qwen3_moe(d.path(), &shape, 11, 17).unwrap();
    let inv = Inventory::from_dir(d.path()).unwrap();
    let index = names::expert_index(&inv, &cfg).unwrap();
    let split = index
        .spans
        .iter()
        .flatten()
        .filter(|s| s.is_split())
        .count();
    assert!(split > 0, "the fixture should split an expert across files");
    check(&shape, 11, 17, 0);
}

#[test]
fn dense_mlp_layers_and_an_unknown_model_type() {
    // `mlp_only_layers` and `decoder_sparse_step` make dense layers (candle-transformers'
    // reference ignores `mlp_only_layers`, so these are checked against transformers in
    // .ci/run); here: they load, run, and batching matches.
    let d = tempfile::tempdir().unwrap();
    let shape = Qwen3MoeShape {
        sparse_step: 2,
        mlp_only: vec![3],
        ..Qwen3MoeShape::tiny()
    };
    let cfg = write_qwen3_moe(d.path(), &shape, 5, 2).unwrap();
    assert_eq!(cfg.moe_layers(), vec![1]);
    let m = Qwen3MoeModel::open(d.path(), &TieredOptions::default()).unwrap();
    let mut s = m.new_state();
    assert_eq!(m.forward(&prompt(9, 5, 900), &mut s).unwrap().len(), 1024);
    // A checkpoint of a family this build does not run names the value and the known ones.
    let text = std::fs::read_to_string(d.path().join("config.json")).unwrap();
    std::fs::write(
        d.path().join("config.json"),
        text.replace("\"qwen3_moe\"", "\"qwen2_moe\""),
    )
    .unwrap();
    let e = deltafin::models::family(d.path())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("qwen2_moe") && e.contains("qwen3_moe"), "{e}");
}

/// The speed reference for `bench forward` (docs/benchmarks.md): candle-transformers'
/// in-RAM `qwen3_moe` (BF16 weights, every expert resident) decoding the checkpoint in
/// `DELTAFIN_QWEN3_BENCH`; prints one JSON line with ms per token over 5 runs.
#[test]
#[ignore = "a benchmark: set DELTAFIN_QWEN3_BENCH to a checkpoint directory"]
fn candle_transformers_decode_speed() {
    let Ok(dir) = std::env::var("DELTAFIN_QWEN3_BENCH") else {
        return;
    };
    let dir = Path::new(&dir);
    let cfg: Config =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let inv = Inventory::from_dir(dir).unwrap();
    let files: Vec<_> = (0..inv.shards.len()).map(|i| inv.shard_path(i)).collect();
    let t0 = std::time::Instant::now();
    // SAFETY: the checkpoint is not modified while mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(&files, DType::BF16, &Device::Cpu).unwrap()
    };
    let mut m = ModelForCausalLM::new(&cfg, vb).unwrap();
    let load_s = t0.elapsed().as_secs_f64();
    let (prompt_len, decode) = (16, 16);
    let p = prompt(prompt_len, 1, 4096);
    let mut per_run = Vec::new();
    for run in 0..6 {
        m.clear_kv_cache();
        let step = |m: &mut ModelForCausalLM, ids: &[u32], pos: usize| -> Vec<f32> {
            let x = Tensor::new(ids, &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let l = m.forward(&x, pos).unwrap();
            l.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let mut logits = step(&mut m, &p, 0);
        let t = std::time::Instant::now();
        for i in 0..decode {
            let next = deltafin::runtime::generate::argmax(&logits);
            logits = step(&mut m, &[next], prompt_len + i);
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / decode as f64;
        if run > 0 {
            per_run.push(ms);
        }
    }
    per_run.sort_by(f64::total_cmp);
    println!(
        "{}",
        serde_json::json!({"figure": "candle_transformers_qwen3_moe_decode", "dtype": "bf16",
            "load_s": load_s, "prompt_len": prompt_len, "decode": decode, "runs": per_run.len(),
            "ms_per_token": {"median": per_run[per_run.len() / 2], "min": per_run[0],
                             "max": per_run[per_run.len() - 1]}})
    );
}
