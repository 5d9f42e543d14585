//! `bench experts`: cold expert reads through the tiered store against raw `O_DIRECT` reads of
//! the same expert bytes by the same number of parallel readers (layer by layer, as the store
//! reads them), measured in the same run; and, for reference, one sequential stream over each
//! layer's whole expert run.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use deltafin::checkpoint::rng::Rng;
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{
    drop_from_page_cache_all, CacheAdvice, ExpertProvider, TieredExperts, TieredOptions,
};
use deltafin::measure::disk::{raw_read, raw_read_jobs};
use deltafin::measure::Stats;
use deltafin::models::k3::config::K3Config;
use deltafin::Result;

/// Options of `bench experts`.
#[derive(Debug, Clone)]
pub struct ExpertsBenchOptions {
    /// Experts read per layer (K3 routes 16).
    pub per_layer: usize,
    /// Reader thread counts to measure.
    pub readers: Vec<usize>,
    /// Timed runs per figure.
    pub runs: usize,
}

/// Runs the benchmark on a K3-format checkpoint (the K3-slice fixture).
pub fn experts_bench(
    dir: &Path,
    opts: &ExpertsBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let cfg = K3Config::from_file(&dir.join("config.json"))?;
    let inv = Arc::new(Inventory::from_dir(dir)?);
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg)?);
    let layers: Vec<usize> = cfg.moe_layers().collect();
    let per = opts.per_layer.min(cfg.text().num_experts).max(1);
    let mut rng = Rng::new(7);
    let picks: Vec<(usize, Vec<usize>)> = layers
        .iter()
        .map(|&l| {
            let mut ids: Vec<usize> = (0..cfg.text().num_experts).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.below(i as u64 + 1) as usize);
            }
            ids.truncate(per);
            (l, ids)
        })
        .collect();
    let bytes: u64 = picks
        .iter()
        .flat_map(|(l, ids)| ids.iter().map(move |&e| (*l, e)))
        .filter_map(|(l, e)| index.span(l, e).map(|s| s.len()))
        .sum();
    emit(
        serde_json::json!({"bench": "experts", "layers": layers.len(), "experts_per_layer": per,
        "bytes_per_run": bytes, "runs": opts.runs}),
    );
    let drop_all = || -> Result<()> {
        for s in 0..inv.shards.len() {
            drop_from_page_cache_all(&inv.shard_path(s))?;
        }
        Ok(())
    };
    // Each run measures the raw rate and then every reader count, so a ratio compares figures
    // taken moments apart on this (noisy, virtual) disk.
    let raw_once = || -> Result<f64> {
        drop_all()?;
        let (mut total, mut secs) = (0f64, 0f64);
        for &l in &layers {
            // Each layer's whole expert run, sequentially, O_DIRECT.
            let spans = &index.spans[l];
            let a = spans.iter().map(|s| s.start()).min().unwrap_or(0);
            let b = spans.iter().map(|s| s.start() + s.len()).max().unwrap_or(0);
            let shard = spans.first().map(|s| s.shard).unwrap_or(0);
            let gbps = raw_read(&inv.shard_path(shard), a, b)?;
            let gb = (b - a) as f64 / 1e9;
            total += gb;
            secs += gb / gbps;
        }
        Ok(total / secs)
    };
    // The bound for r readers: the same experts' bytes, layer by layer, split over r threads
    // reading `O_DIRECT` (the store's split), with nothing else in the way.
    let paths: Vec<std::path::PathBuf> = (0..inv.shards.len()).map(|s| inv.shard_path(s)).collect();
    let raw_parallel_once = |r: usize| -> Result<f64> {
        drop_all()?;
        let t0 = Instant::now();
        for (l, ids) in &picks {
            let jobs: Vec<(usize, Vec<(u64, u64)>)> = ids
                .iter()
                .filter_map(|&e| index.span(*l, e))
                .map(|s| (s.shard, s.parts.clone()))
                .collect();
            raw_read_jobs(&paths, &jobs, r)?;
        }
        Ok(bytes as f64 / 1e9 / t0.elapsed().as_secs_f64())
    };
    let store_once = |r: usize| -> Result<f64> {
        drop_all()?;
        let o = TieredOptions {
            ram_budget: 0,
            readers: r.max(1),
            advice: CacheAdvice::Auto,
            prefetch_previous: false,
            ..Default::default()
        };
        let store = TieredExperts::new(index.clone(), Some(inv.clone()), None, &o)?;
        let t0 = Instant::now();
        for (l, ids) in &picks {
            std::hint::black_box(store.fetch(*l, ids)?);
        }
        Ok(bytes as f64 / 1e9 / t0.elapsed().as_secs_f64())
    };
    let mut raw = Vec::new();
    // Per reader count: (raw parallel GB/s, store GB/s, store / raw of the same run).
    type Runs = (Vec<f64>, Vec<f64>, Vec<f64>);
    let mut per: Vec<Runs> = vec![(Vec::new(), Vec::new(), Vec::new()); opts.readers.len()];
    for _ in 0..opts.runs.max(1) {
        raw.push(raw_once()?);
        for (k, &r) in opts.readers.iter().enumerate() {
            let bound = raw_parallel_once(r)?;
            let g = store_once(r)?;
            per[k].0.push(bound);
            per[k].1.push(g);
            per[k].2.push(g / bound);
        }
    }
    let raw = Stats::of(raw);
    emit(
        serde_json::json!({"figure": "raw_sequential_read_gbps", "median": raw.median, "min": raw.min, "max": raw.max}),
    );
    for (k, &r) in opts.readers.iter().enumerate() {
        let b = Stats::of(per[k].0.clone());
        let (s, q) = (Stats::of(per[k].1.clone()), Stats::of(per[k].2.clone()));
        emit(
            serde_json::json!({"figure": "raw_parallel_read_gbps", "readers": r, "median": b.median, "min": b.min, "max": b.max}),
        );
        emit(
            serde_json::json!({"figure": "expert_read_gbps", "readers": r, "median": s.median, "min": s.min,
            "max": s.max, "ratio_to_raw_parallel_median": q.median, "ratio_min": q.min, "ratio_max": q.max}),
        );
    }
    Ok(())
}
