//! `bench spine`: cold per-layer loads of the spine store (BF16 and row-int8) against raw
//! `O_DIRECT` reads of the same files, and how much of the load the read-ahead hides behind
//! compute.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{drop_from_page_cache_all, TieredExperts, TieredOptions};
use deltafin::fsio::BufPool;
use deltafin::measure::disk::{raw_read, raw_read_jobs};
use deltafin::measure::Stats;
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::K3Model;
use deltafin::spine::convert::{convert_spine, store_dir, SpineFormat};
use deltafin::spine::layer::{read_file, read_file_direct};
use deltafin::spine::source::{Spine, SpineChoice, SpineOptions};
use deltafin::Result;

/// `O_DIRECT` requests in flight for the raw bound.
const RAW_READERS: usize = 4;

/// Runs the benchmark on a K3-format checkpoint (the K3-slice fixture); converts the spine
/// stores first when they are missing.
pub fn spine_bench(dir: &Path, runs: usize, mut emit: impl FnMut(serde_json::Value)) -> Result<()> {
    let cfg = K3Config::from_file(&dir.join("config.json"))?;
    let inv = Arc::new(Inventory::from_dir(dir)?);
    let n = cfg.num_layers();
    // The embedding rows, read per row vs copied from a mapping (the BF16 store's embed.bin).
    convert_spine(&inv, n, dir, SpineFormat::Bf16, |_, _| {})?;
    super::mapped::embed_bench(&store_dir(dir, SpineFormat::Bf16), runs, &mut emit)?;
    // Pinned layers: read into buffers (the spine) vs mapped from the store.
    super::mapped::pinned_bench(&store_dir(dir, SpineFormat::Bf16), n, runs, &mut emit)?;
    for format in [SpineFormat::Bf16, SpineFormat::Int8] {
        let t0 = Instant::now();
        convert_spine(&inv, n, dir, format, |_, _| {})?;
        emit(
            serde_json::json!({"bench": "spine", "format": format.dir_name(), "convert_or_check_s": t0.elapsed().as_secs_f64()}),
        );
        let sd = store_dir(dir, format);
        let pool = BufPool::new(2);
        let (mut load, mut raw, mut ratio, mut seq) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut direct, mut dratio) = (Vec::new(), Vec::new());
        let (mut into_layer, mut lratio) = (Vec::new(), Vec::new());
        // A second bound: the same requests landing in a layer-sized buffer, where a loader's
        // bytes must go (the first bound overwrites one 16 MiB buffer per reader).
        let largest = (0..n)
            .filter_map(|l| std::fs::metadata(sd.join(format!("layer-{l:03}.bin"))).ok())
            .map(|m| m.len() as usize)
            .max()
            .unwrap_or(0);
        let mut big = deltafin::fsio::AlignedBuf::new(largest.div_ceil(4096) * 4096)?;
        let mut total_bytes = 0u64;
        for run in 0..runs.max(1) {
            let (mut lt, mut rt, mut st, mut dt, mut bytes) = (0f64, 0f64, 0f64, 0f64, 0u64);
            let mut bt = 0f64;
            for l in 0..n {
                let p = sd.join(format!("layer-{l:03}.bin"));
                let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
                drop_from_page_cache_all(&p)?;
                let t = Instant::now();
                std::hint::black_box(read_file(&p, &pool)?);
                lt += t.elapsed().as_secs_f64();
                // The loader and its two bounds, in an order rotated every run and layer: this
                // disk's rate depends on what came just before (one run read the loader, always
                // second, at 1.5× the bound read right after it).
                for k in 0..3 {
                    drop_from_page_cache_all(&p)?;
                    let t = Instant::now();
                    let slot = match (k + run + l) % 3 {
                        // The streamed layers' loader on a small machine: parallel O_DIRECT.
                        0 => {
                            std::hint::black_box(read_file_direct(&p, &pool, 0)?);
                            &mut dt
                        }
                        // The bound: the same file, `O_DIRECT`, 1 MiB requests with
                        // RAW_READERS in flight, each reader overwriting one 16 MiB buffer.
                        1 => {
                            let req = deltafin::fsio::direct::REQUEST as u64;
                            let jobs: Vec<(usize, Vec<(u64, u64)>)> = (0..len)
                                .step_by(req as usize)
                                .map(|o| (0, vec![(o, req.min(len - o))]))
                                .collect();
                            raw_read_jobs(std::slice::from_ref(&p), &jobs, RAW_READERS)?;
                            &mut rt
                        }
                        // The same requests into a layer-sized buffer.
                        _ => {
                            deltafin::fsio::direct::read_all(&p, len as usize, &mut big)?;
                            &mut bt
                        }
                    };
                    *slot += t.elapsed().as_secs_f64();
                }
                // For reference: one synchronous stream.
                drop_from_page_cache_all(&p)?;
                st += len as f64 / 1e9 / raw_read(&p, 0, len)?;
                bytes += len;
            }
            total_bytes = bytes;
            load.push(bytes as f64 / 1e9 / lt);
            raw.push(bytes as f64 / 1e9 / rt);
            seq.push(bytes as f64 / 1e9 / st);
            ratio.push(rt / lt);
            direct.push(bytes as f64 / 1e9 / dt);
            dratio.push(rt / dt);
            into_layer.push(bytes as f64 / 1e9 / bt);
            lratio.push(bt / dt);
        }
        let (l, r, q) = (Stats::of(load), Stats::of(raw), Stats::of(ratio));
        let sq = Stats::of(seq);
        emit(
            serde_json::json!({"figure": "raw_sequential_read_gbps", "format": format.dir_name(), "median": sq.median, "min": sq.min, "max": sq.max}),
        );
        emit(
            serde_json::json!({"figure": "layer_load_gbps", "format": format.dir_name(), "layers": n,
            "bytes": total_bytes, "ms_per_layer": total_bytes as f64 / 1e6 / n as f64 / l.median,
            "median": l.median, "min": l.min, "max": l.max}),
        );
        let (d, dq) = (Stats::of(direct), Stats::of(dratio));
        emit(
            serde_json::json!({"figure": "layer_load_direct_gbps", "format": format.dir_name(),
            "median": d.median, "min": d.min, "max": d.max,
            "direct_to_raw_median": dq.median, "direct_to_raw_min": dq.min, "direct_to_raw_max": dq.max}),
        );
        let (b, bq) = (Stats::of(into_layer), Stats::of(lratio));
        emit(
            serde_json::json!({"figure": "raw_parallel_into_layer_buffer_gbps", "format": format.dir_name(),
            "median": b.median, "min": b.min, "max": b.max,
            "direct_to_it_median": bq.median, "direct_to_it_min": bq.min, "direct_to_it_max": bq.max}),
        );
        emit(
            serde_json::json!({"figure": "raw_parallel_read_gbps", "readers": RAW_READERS, "format": format.dir_name(), "median": r.median, "min": r.min, "max": r.max,
            "load_to_raw_median": q.median, "load_to_raw_min": q.min, "load_to_raw_max": q.max}),
        );
    }
    // Hidden fraction: one token with every layer pinned (compute only) vs every layer streamed
    // (compute + loads, read ahead), against the cold load time of the layers alone.
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg)?);
    let experts = Arc::new(TieredExperts::new(
        index,
        Some(inv.clone()),
        None,
        &TieredOptions {
            ram_budget: 8 << 30,
            ..Default::default()
        },
    )?);
    let open = |resident: Option<u64>| -> Result<K3Model> {
        let o = SpineOptions {
            choice: SpineChoice::Bf16,
            resident_bytes: resident,
            ..Default::default()
        };
        let spine = Spine::open(dir, inv.clone(), n, &candle::Device::Cpu, &o)?;
        K3Model::load(cfg.clone(), Arc::new(spine), experts.clone())
    };
    let sd = store_dir(dir, SpineFormat::Bf16);
    let drop_all = || -> Result<()> {
        for l in 0..n {
            drop_from_page_cache_all(&sd.join(format!("layer-{l:03}.bin")))?;
        }
        Ok(())
    };
    let token = |m: &K3Model| -> Result<f64> {
        let mut st = m.new_state();
        let t = Instant::now();
        m.forward(&[1], &mut st)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let pinned = open(None)?;
    token(&pinned)?; // warms the expert RAM tier
    let (mut comp, mut streamed, mut loads, mut hidden) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let streaming = open(Some(0))?;
    let pool = BufPool::new(1);
    for _ in 0..runs.max(1) {
        let c = token(&pinned)?;
        drop_all()?;
        let s = token(&streaming)?;
        drop_all()?;
        let t = Instant::now();
        for l in 0..n {
            std::hint::black_box(read_file(&sd.join(format!("layer-{l:03}.bin")), &pool)?);
        }
        let ld = t.elapsed().as_secs_f64();
        comp.push(c * 1e3);
        streamed.push(s * 1e3);
        loads.push(ld * 1e3);
        hidden.push((1.0 - (s - c) / ld).clamp(0.0, 1.0));
    }
    let (c, s, l, h) = (
        Stats::of(comp),
        Stats::of(streamed),
        Stats::of(loads),
        Stats::of(hidden),
    );
    emit(
        serde_json::json!({"figure": "token_ms", "pinned_median": c.median, "streamed_median": s.median,
        "cold_loads_median": l.median, "hidden_fraction_median": h.median, "hidden_min": h.min, "hidden_max": h.max}),
    );
    Ok(())
}
