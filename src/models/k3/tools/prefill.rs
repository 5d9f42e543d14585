//! `bench prefill`: one prompt's prefill in the layer-major order (the default) and in the old
//! chunk-major order (`prefill_pass = prefill_chunk`), side by side in one run, each run on a
//! freshly opened model (nothing cached from the previous one). Per order and prompt length:
//! bytes read from storage ÷ the distinct weight bytes the prompt needs (the streamed spine
//! layers once, plus every distinct routed expert's span), wall time ÷ max(I/O floor, compute
//! floor), and peak RSS (`VmHWM`, reset before each run) against the memory plan. The floors
//! come from rates measured in the same run: the shards' read rate right before each run, and
//! the dense and MXFP4 kernels' throughput at a prefill chunk's row count at the start.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

use candle::Device;

use deltafin::checkpoint::rng::Rng;
use deltafin::checkpoint::Inventory;
use deltafin::kernels::dense::{gemm, DenseData, DenseMatrix};
use deltafin::measure::Stats;
use deltafin::models::k3::config::{AttnKind, K3Config};
use deltafin::models::k3::K3Model;
use deltafin::mxfp4::{Kernel, Mxfp4Expert};
use deltafin::runtime::load::LoadOptions;
use deltafin::runtime::observe::RouteCollector;
use deltafin::Result;

/// Settings of the prefill bench.
pub struct PrefillBenchOptions {
    /// Prompt lengths.
    pub lengths: Vec<usize>,
    /// Runs per order and length.
    pub runs: usize,
    /// Prompt ids are drawn below this (the vocabulary when `None`).
    pub id_max: Option<u32>,
    /// Also run the old chunk-major order.
    pub chunk_major: bool,
}

/// Kernel throughputs (FLOP/s) at a prefill chunk's row count.
struct Rates {
    dense: f64,
    mxfp4: f64,
}

/// Best of three: the dense kernel on a K3-size matrix and the MXFP4 kernel on one expert,
/// each over `rows` input rows.
fn kernel_rates(cfg: &K3Config, rows: usize, int8: bool, kernel: Kernel) -> Result<Rates> {
    let t = cfg.text();
    let (r, c) = (t.hidden_size, t.hidden_size);
    let mut rng = Rng::new(3);
    // BF16 weights as a trained checkpoint's (normal, sigma 0.02). Raw random bytes hold
    // subnormals (1 in 64), which cost a microcode assist per use on Intel cores: this probe
    // then said 4.6 GFLOP/s where the same kernel does about 114 on normal values (CI run of
    // 2026-12-05, a Sapphire Rapids machine), and the prefill looked 10x faster than its floor.
    let bytes: Vec<u8> = if int8 {
        (0..r * c).map(|_| (rng.next_u64() & 0x3f) as u8).collect()
    } else {
        (0..r * c)
            .flat_map(|_| half::bf16::from_f32(rng.normal() as f32 * 0.02).to_le_bytes())
            .collect()
    };
    let scales: Vec<u8> = (0..r)
        .flat_map(|_| half::f16::from_f32(0.01).to_le_bytes())
        .collect();
    let data = if int8 {
        DenseData::I8 {
            q: &bytes,
            scales: &scales,
        }
    } else {
        DenseData::Bf16(&bytes)
    };
    let m = DenseMatrix::new(data, r, c)?;
    let x: Vec<f32> = (0..rows * c).map(|_| rng.normal() as f32).collect();
    let mut y = vec![0f32; rows * r];
    let best = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut b = f64::MAX;
        for _ in 0..3 {
            let t0 = Instant::now();
            f()?;
            b = b.min(t0.elapsed().as_secs_f64());
        }
        Ok(b)
    };
    let secs = best(&mut || gemm(&m, &x, rows, &mut y))?;
    let dense = 2.0 * (rows * r * c) as f64 / secs;
    let (inter, lat) = (t.moe_intermediate_size, t.routed_expert_hidden_size);
    let span = cfg.expert_span_bytes();
    let mut eb: Vec<u8> = (0..span).map(|_| rng.next_u64() as u8).collect();
    // Scale bytes in a trained checkpoint's band (as `bench mxfp4`).
    let (packed, sc) = (inter * lat / 2, inter * lat / 32);
    for k in 0..3 {
        let at = k * (packed + sc) + packed;
        eb[at..at + sc]
            .iter_mut()
            .for_each(|b| *b = 112 + (*b & 15));
    }
    let e = Mxfp4Expert::from_span(&eb, inter, lat)?;
    let z: Vec<f32> = (0..rows * lat).map(|_| rng.normal() as f32).collect();
    let hdn: Vec<f32> = (0..rows * inter).map(|_| rng.normal() as f32).collect();
    let (mut y1, mut y2) = (vec![0f32; rows * inter], vec![0f32; rows * lat]);
    let secs = best(&mut || {
        deltafin::mxfp4::gemm_with(kernel, &e.w1, &z, rows, &mut y1, true)?;
        deltafin::mxfp4::gemm_with(kernel, &e.w3, &z, rows, &mut y1, true)?;
        deltafin::mxfp4::gemm_with(kernel, &e.w2, &hdn, rows, &mut y2, true)
    })?;
    let mxfp4 = 2.0 * 3.0 * (rows * inter * lat) as f64 / secs;
    Ok(Rates { dense, mxfp4 })
}

/// Weights of every decoder layer's spine matrices (what each position multiplies).
fn spine_params(inv: &Inventory, layers: usize) -> u64 {
    (0..layers)
        .flat_map(|l| deltafin::spine::convert::layer_names(inv, l))
        .filter_map(|n| inv.get(&n))
        .filter(|t| !deltafin::spine::convert::is_small(&t.shape))
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum()
}

/// FLOPs of a prefill of `n` positions with `pairs` (position, expert) products: the spine
/// matrices per position, the routed experts, MLA's scores and values in the latent space, and
/// the KDA recurrence.
fn prefill_flops(cfg: &K3Config, spine: u64, n: usize, pairs: usize) -> (f64, f64) {
    let t = cfg.text();
    let la = &t.linear_attn_config;
    let n_f = n as f64;
    let mut dense = 2.0 * n_f * spine as f64 + 2.0 * (t.vocab_size * t.hidden_size) as f64;
    for k in &cfg.schedule {
        match k.attn {
            AttnKind::Mla => {
                let per_key = (2 * (t.kv_lora_rank + t.qk_rope_head_dim) + 2 * t.kv_lora_rank)
                    * t.num_attention_heads;
                dense += n_f * (n_f + 1.0) / 2.0 * per_key as f64;
            }
            AttnKind::Kda => dense += n_f * 6.0 * (la.num_heads * la.head_dim * la.head_dim) as f64,
        }
    }
    let expert =
        2.0 * 3.0 * pairs as f64 * (t.moe_intermediate_size * t.routed_expert_hidden_size) as f64;
    (dense, expert)
}

/// One measured prefill.
struct Run {
    ms: f64,
    read: u64,
    distinct: u64,
    pairs: usize,
    peak: u64,
    plan: u64,
    passes: usize,
}

fn one_run(
    root: &Path,
    device: &Device,
    load: &LoadOptions,
    ids: &[u32],
    old: bool,
) -> Result<Run> {
    let mut model = K3Model::open_with(root, device, load, |_| {})?;
    if old {
        model.options.prefill_pass = model.options.prefill_chunk;
    }
    let plan = model.plan().map(|p| p.total).unwrap_or(0);
    let routes = RouteCollector::default();
    let mut st = model.new_state();
    deltafin::runtime::memory::reset_peak();
    let read0 = model.bytes_read();
    let t0 = Instant::now();
    model.forward_with(ids, &mut st, Some(&routes), None)?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let read = model.bytes_read() - read0;
    let peak = deltafin::runtime::memory::rss().1;
    let trace = routes.take();
    let pairs = trace
        .iter()
        .map(|(_, r)| r.len() * model.config().text().num_experts_per_token)
        .sum();
    let experts: BTreeSet<(usize, usize)> = trace
        .iter()
        .flat_map(|(l, rs)| {
            rs.iter()
                .flat_map(move |r| r.experts.iter().map(move |&e| (*l, e)))
        })
        .collect();
    let distinct = model.spine().report().bytes_read_per_token
        + experts.len() as u64 * model.config().expert_span_bytes() as u64;
    Ok(Run {
        ms,
        read,
        distinct,
        pairs,
        peak,
        plan,
        passes: ids.len().div_ceil(model.options.pass_len()),
    })
}

/// Runs the bench; one JSON line per figure.
pub fn prefill_bench(
    root: &Path,
    device: &Device,
    load: &LoadOptions,
    o: &PrefillBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let probe = K3Model::open_with(root, device, load, |p| eprintln!("{p}"))?;
    let cfg = probe.config().clone();
    let (chunk, pass) = (probe.options.prefill_chunk, probe.options.prefill_pass);
    let int8 = probe.spine().report().format == deltafin::spine::convert::SpineFormat::Int8;
    let kernel = probe.options.kernel;
    drop(probe);
    let inv = Inventory::from_dir(root)?;
    let spine = spine_params(&inv, cfg.num_layers());
    let rates = kernel_rates(&cfg, chunk, int8, kernel)?;
    emit(serde_json::json!({"figure": "bounds",
        "dense_gflops": rates.dense / 1e9, "mxfp4_gflops": rates.mxfp4 / 1e9,
        "rows": chunk, "prefill_pass": pass}));
    let vocab = cfg.text().vocab_size as u32;
    let id_max = o.id_max.unwrap_or(vocab).clamp(1, vocab);
    for &n in &o.lengths {
        let mut rng = Rng::new(n as u64);
        let ids: Vec<u32> = (0..n).map(|_| rng.below(id_max as u64) as u32).collect();
        let orders: &[(&str, bool)] = if o.chunk_major {
            &[("layer-major", false), ("chunk-major", true)]
        } else {
            &[("layer-major", false)]
        };
        for &(name, old) in orders {
            // Each run right after its own read-rate measurement (this disk varies by ±50%).
            let mut runs = Vec::new();
            for _ in 0..o.runs.max(1) {
                let gbps = deltafin::measure::disk::shard_read_gbps(root, 4_000_000_000)?;
                runs.push((gbps, one_run(root, device, load, &ids, old)?));
            }
            let r0 = &runs[0].1;
            let (dense, expert) = prefill_flops(&cfg, spine, n, r0.pairs);
            let compute_s = dense / rates.dense + expert / rates.mxfp4;
            let io_s = |gbps: f64| r0.distinct as f64 / 1e9 / gbps;
            let floor_ms = |gbps: f64| 1e3 * compute_s.max(io_s(gbps));
            let ratio = Stats::of(
                runs.iter()
                    .map(|(_, r)| r.read as f64 / r.distinct as f64)
                    .collect(),
            );
            let wall = Stats::of(runs.iter().map(|(_, r)| r.ms).collect());
            let over = Stats::of(runs.iter().map(|(g, r)| r.ms / floor_ms(*g)).collect());
            let io = Stats::of(runs.iter().map(|(g, _)| io_s(*g) * 1e3).collect());
            let peak = runs.iter().map(|(_, r)| r.peak).max().unwrap_or(0);
            emit(
                serde_json::json!({"figure": "prefill", "order": name, "prompt_len": n,
                "runs": runs.len(), "passes": r0.passes,
                "bytes_read_gb": r0.read as f64 / 1e9, "distinct_gb": r0.distinct as f64 / 1e9,
                "read_over_distinct": {"median": ratio.median, "min": ratio.min, "max": ratio.max},
                "wall_ms": {"median": wall.median, "min": wall.min, "max": wall.max},
                "io_floor_ms": {"median": io.median, "min": io.min, "max": io.max},
                "compute_floor_ms": compute_s * 1e3,
                "wall_over_floor": {"median": over.median, "min": over.min, "max": over.max},
                "peak_rss_gb": peak as f64 / 1e9, "plan_total_gb": r0.plan as f64 / 1e9,
                "within_plan": peak <= r0.plan}),
            );
        }
    }
    Ok(())
}
