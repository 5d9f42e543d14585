//! `deltafin-k3 bench forward`: prefill and decode with each KDA form; `--context N` (one MLA
//! layer's decode step at a given context: time and the bytes it allocates); `--breakdown`
//! (per decode token at any shape: compute, spine and expert wait, bytes read, and the floor
//! those bytes cost at the read and memory bandwidths measured in the same run).

use std::path::Path;
use std::time::Instant;

use candle::Tensor;

use deltafin::measure::forward::{time_forward, ForwardBenchOptions};
use deltafin::measure::memory::stream_read;
use deltafin::measure::Stats;
use deltafin::models::k3::config::AttnKind;
use deltafin::models::k3::K3Model;
use deltafin::runtime::state::LayerState;
use deltafin::{Error, Result};

/// Times one MLA layer's decode step with `n` positions already cached, for each `n`.
pub fn context_bench(
    model: &K3Model,
    contexts: &[usize],
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let l = model
        .config()
        .schedule
        .iter()
        .position(|k| k.attn == AttnKind::Mla)
        .ok_or_else(|| Error::Msg("the model has no MLA layer".into()))?;
    let ld = model.spine().load_layer(l)?;
    let h = model.config().text().hidden_size;
    let mut rng = deltafin::checkpoint::rng::Rng::new(1);
    let mut rand = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| (rng.uniform() as f32 * 2.0 - 1.0) * 0.5)
            .collect()
    };
    let x = Tensor::from_vec(rand(h), (1, h), model.device())?;
    let mut per_ctx = Vec::new();
    for &n in contexts {
        let mut st = model.new_state();
        let LayerState::Rows(cache) = &mut st.layers[l] else {
            return Err(Error::Msg(format!("layer {l} is not MLA")));
        };
        let width = cache.width();
        // Fill the cache in pieces (random latents: the cost does not depend on the values).
        for _ in 0..n / 4096 {
            cache.append(&rand(4096 * width));
        }
        cache.append(&rand((n % 4096) * width));
        st.pos = n;
        // Warm-up (the cache doubles its capacity once here), then timed steps.
        model.attention(l, &x, &mut st, &ld)?;
        let (mut ms, mut alloc) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let base = deltafin::alloc_count::reset_peak();
            let t0 = Instant::now();
            model.attention(l, &x, &mut st, &ld)?;
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
            alloc.push((deltafin::alloc_count::peak() - base) as f64);
        }
        let (t, a) = (Stats::of(ms), Stats::of(alloc));
        emit(
            serde_json::json!({"figure": "mla_decode_step_ms", "layer": l, "context": n,
            "median": t.median, "min": t.min, "max": t.max,
            "alloc_peak_bytes": if deltafin::alloc_count::installed() { serde_json::json!(a.median) } else { serde_json::Value::Null }}),
        );
        per_ctx.push((n, t.median));
    }
    if let (Some(first), Some(last)) = (per_ctx.first(), per_ctx.last()) {
        emit(
            serde_json::json!({"figure": "mla_step_time_ratio", "from": first.0, "to": last.0,
            "ratio": last.1 / first.1, "context_ratio": last.0 as f64 / first.0 as f64}),
        );
    }
    Ok(())
}

/// Per decode token: compute (attention, MoE), spine and expert wait, bytes read, and the
/// floor of the same work from the bandwidths measured in this run.
pub fn breakdown_bench(
    model: &mut K3Model,
    root: &Path,
    prompt_len: usize,
    decode: usize,
    runs: usize,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let words = vec![1u64; 1 << 27]; // 1 GiB, well above any L3
    let _ = stream_read(&words);
    let t0 = Instant::now();
    std::hint::black_box(stream_read(std::hint::black_box(&words)));
    let mem_gbps = (8u64 << 27) as f64 / 1e9 / t0.elapsed().as_secs_f64();
    drop(words);
    let read_gbps = deltafin::measure::disk::shard_read_gbps(root, 4_000_000_000)?;
    emit(
        serde_json::json!({"figure": "bandwidth", "memory_read_gbps": mem_gbps, "shard_read_gbps": read_gbps}),
    );
    let profile = std::sync::Arc::new(deltafin::runtime::observers::LayerProfile::new(
        model.experts().clone(),
    ));
    model.observe(profile.clone());
    let r = model.spine().report();
    let all_spine = r.resident_bytes + r.bytes_read_per_token;
    let vocab = model.config().text().vocab_size as u32;
    let prompt: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % vocab)
        .collect();
    let fields = [
        "attention_ms",
        "moe_compute_ms",
        "spine_wait_ms",
        "expert_wait_ms",
        "other_ms",
        "total_ms",
        "expert_bytes",
        "floor_read_ms",
        "floor_compute_ms",
    ];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); fields.len()];
    for run in 0..runs.max(1) {
        let mut st = model.new_state();
        let mut logits = model.forward(&prompt, &mut st)?.to_vec1::<f32>()?;
        profile.take();
        for i in 0..decode {
            let next = deltafin::runtime::generate::argmax(&logits);
            let before = model.expert_stats().unwrap_or_default();
            let t0 = Instant::now();
            logits = model.forward(&[next], &mut st)?.to_vec1::<f32>()?;
            let total = t0.elapsed().as_secs_f64() * 1e3;
            let d = model.expert_stats().unwrap_or_default().since(&before);
            let layers = profile.take();
            let sum = |f: fn(&deltafin::runtime::observers::LayerTiming) -> f64| {
                layers.iter().map(f).sum::<f64>()
            };
            let expert_bytes = d.bytes_read() as f64;
            let read = r.bytes_read_per_token as f64 + expert_bytes;
            let v = [
                sum(|t| t.attn_ms),
                sum(|t| t.ffn_ms - t.expert_wait_ms),
                sum(|t| t.spine_wait_ms),
                sum(|t| t.expert_wait_ms),
                sum(|t| t.other_ms),
                total,
                expert_bytes,
                read / 1e9 / read_gbps * 1e3,
                (all_spine as f64 + expert_bytes) / 1e9 / mem_gbps * 1e3,
            ];
            let mut line = serde_json::json!({"figure": "decode_token", "run": run, "token": i,
                "spine_bytes_read": r.bytes_read_per_token});
            for (k, x) in fields.iter().zip(v) {
                line[*k] = serde_json::json!(x);
            }
            emit(line);
            for (s, x) in samples.iter_mut().zip(v) {
                s.push(x);
            }
        }
    }
    model.clear_observers();
    let mut summary = serde_json::json!({"figure": "decode_token_summary", "tokens": samples[0].len(),
        "spine_bytes_read": r.bytes_read_per_token, "memory_read_gbps": mem_gbps, "shard_read_gbps": read_gbps});
    for (k, s) in fields.iter().zip(samples) {
        let st = Stats::of(s);
        summary[*k] = serde_json::json!({"median": st.median, "min": st.min, "max": st.max});
    }
    emit(summary);
    Ok(())
}

/// Times prefill (ms per prompt token) and decode (ms per token) with each KDA form.
pub fn forward_bench(
    model: &mut K3Model,
    o: &ForwardBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    use deltafin::models::k3::KdaMode;
    for (name, mode) in [
        ("recurrent", KdaMode::Recurrent),
        ("chunked16", KdaMode::Chunked(16)),
        ("chunked64", KdaMode::Chunked(64)),
    ] {
        model.options.kda = mode;
        let (p, d) = time_forward(&*model, o)?;
        emit(
            serde_json::json!({"figure": "prefill_ms_per_token", "kda": name, "prompt_len": o.prompt_len.max(1),
            "median": p.median, "min": p.min, "max": p.max}),
        );
        emit(
            serde_json::json!({"figure": "decode_ms_per_token", "kda": name, "median": d.median, "min": d.min, "max": d.max}),
        );
    }
    Ok(())
}
