//! `bench forward --floor` on a gpt-oss checkpoint: decode ms per token against the floor of
//! the bytes a token must touch (every dense layer, lm_head, the embedding row and the top-k
//! experts of every layer) at the memory read rate measured right before each run; and the
//! expert bytes each token read from storage (what the RAM tier did not hold).

use std::path::Path;
use std::time::Instant;

use deltafin::models::gpt_oss::{plan::expert_bytes, GptOssModel};
use deltafin::runtime::generate::argmax;
use deltafin::runtime::load::LoadOptions;
use deltafin::Result;

use super::{stream_read, Stats};

/// Bytes one decode token touches: the dense layers, lm_head, one embedding row, and
/// `top_k` experts per layer.
fn token_bytes(model: &GptOssModel, root: &Path) -> Result<u64> {
    let inv = deltafin::checkpoint::Inventory::from_dir(root)?;
    let cfg = model.config();
    let dense: u64 = (0..cfg.num_hidden_layers)
        .flat_map(|l| inv.dense_layer_names(l))
        .filter_map(|n| inv.get(&n).map(|t| t.len()))
        .sum();
    let lm_head = inv.get("lm_head.weight").map_or(0, |t| t.len());
    let row = 2 * cfg.hidden_size as u64;
    let experts = (cfg.num_hidden_layers * cfg.top_k()) as u64 * expert_bytes(cfg);
    Ok(dense + lm_head + row + experts)
}

/// Runs the bench; `emit` gets one JSON line per run and a summary.
pub fn decode_floor(
    root: &Path,
    prompt_len: usize,
    decode: usize,
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let model = GptOssModel::open_planned(
        root,
        &LoadOptions {
            max_batch: None,
            ..Default::default()
        },
        |p| eprintln!("{p}"),
    )?;
    let bytes = token_bytes(&model, root)?;
    let vocab = model.config().vocab_size.min(4096) as u32;
    let prompt: Vec<u32> = (0..prompt_len.max(1) as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let words: Vec<u64> = (0..(1usize << 30) / 8).map(|i| i as u64).collect();
    let (mut walls, mut ratios, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs.max(1) + 1 {
        let t0 = Instant::now();
        std::hint::black_box(stream_read(std::hint::black_box(&words)));
        let bw = (words.len() * 8) as f64 / t0.elapsed().as_secs_f64();
        let mut state = model.new_state();
        let mut logits = model.forward(&prompt, &mut state)?;
        let read0 = model.experts().stats().unwrap_or_default().bytes_read();
        let t1 = Instant::now();
        for _ in 0..decode.max(1) {
            let next = argmax(&logits);
            logits = model.forward(&[next], &mut state)?;
        }
        let ms = t1.elapsed().as_secs_f64() * 1e3 / decode.max(1) as f64;
        let read = (model.experts().stats().unwrap_or_default().bytes_read() - read0) as f64
            / decode.max(1) as f64;
        let floor_ms = bytes as f64 / bw * 1e3;
        emit(
            serde_json::json!({"figure": "gpt_oss_decode_run", "run": run,
            "warmup": run == 0, "ms_per_token": ms, "floor_ms": floor_ms,
            "memory_read_gbps": bw / 1e9, "expert_bytes_read_per_token": read}),
        );
        // The first run warms the page cache and the RAM tier; it is not counted.
        if run > 0 {
            walls.push(ms);
            ratios.push(ms / floor_ms);
            reads.push(read);
        }
    }
    let (w, r, e) = (Stats::of(walls), Stats::of(ratios), Stats::of(reads));
    emit(
        serde_json::json!({"figure": "gpt_oss_decode_floor", "layers": model.config().num_hidden_layers,
        "prompt_len": prompt.len(), "decode": decode, "runs": runs, "bytes_per_token": bytes,
        "ms_per_token": {"median": w.median, "min": w.min, "max": w.max},
        "wall_over_floor": {"median": r.median, "min": r.min, "max": r.max},
        "expert_bytes_read_per_token": {"median": e.median, "min": e.min, "max": e.max}}),
    );
    Ok(())
}
