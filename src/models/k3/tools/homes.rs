//! `bench homes`: expert wait per token with 1, 2, 4, … emulated storage homes of equal rate
//! (each home rate-limited in the reader, since these machines have one disk), against the
//! ideal `wait(1) / n`. The homes are hard links of one populated directory, so their bytes
//! are identical and the page cache serves them: the emulated rate is what is measured.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{ExpertProvider, TieredOptions};
use deltafin::install::homes::{populate_home, HomeSelection};
use deltafin::installed::expert_store;
use deltafin::measure::Stats;
use deltafin::models::k3::config::K3Config;
use deltafin::{Error, Result};

/// Settings of the homes bench.
pub struct HomesBenchOptions {
    /// Home counts to compare (the first is the baseline; 1 for the ideal's definition).
    pub homes: Vec<usize>,
    /// Emulated rate of each home, bytes per second.
    pub rate: f64,
    /// Tokens per run (each: every MoE layer's `num_experts_per_token` distinct experts).
    pub tokens: usize,
    /// Runs; each times every home count once, in rotating order.
    pub runs: usize,
    /// Where the homes are made (removed afterwards).
    pub scratch: PathBuf,
}

/// Hard-links every file of `from` into a new directory `to`.
fn link_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| Error::io(to, e))?;
    for e in std::fs::read_dir(from).map_err(|e| Error::io(from, e))? {
        let p = e.map_err(|e| Error::io(from, e))?.path();
        if p.is_file() {
            let q = to.join(p.file_name().unwrap_or_default());
            std::fs::hard_link(&p, &q).map_err(|e| Error::io(&q, e))?;
        }
    }
    Ok(())
}

/// Runs the bench; one JSON line per run and home count, and a summary per home count.
pub fn homes_bench(
    root: &Path,
    o: &HomesBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let cfg = K3Config::from_file(&root.join("config.json"))?;
    let (n, k) = (cfg.text().num_experts, cfg.text().num_experts_per_token);
    let layers: Vec<usize> = cfg.moe_layers().collect();
    // Token t reads experts t·k .. t·k+k (mod n) of every MoE layer: all distinct within a layer.
    let select = |t: usize| -> Vec<usize> { (0..k).map(|j| (t * k + j) % n).collect() };
    let mut want = Vec::new();
    for t in 0..o.tokens {
        for &l in &layers {
            want.extend(select(t).into_iter().map(|e| (l, e)));
        }
    }
    want.sort();
    want.dedup();
    let most = o.homes.iter().copied().max().unwrap_or(1).max(1);
    let _ = std::fs::remove_dir_all(&o.scratch);
    let dirs: Vec<PathBuf> = (0..most)
        .map(|i| o.scratch.join(format!("home{i}")))
        .collect();
    let no = AtomicBool::new(false);
    let t0 = Instant::now();
    populate_home(
        root,
        &dirs[0],
        &HomeSelection::Experts(want.clone()),
        &no,
        |_, _| {},
    )?;
    for d in &dirs[1..] {
        link_dir(&dirs[0], d)?;
    }
    emit(
        serde_json::json!({"bench": "homes", "experts": want.len(), "expert_bytes": cfg.expert_span_bytes(),
        "moe_layers": layers.len(), "per_layer": k, "tokens": o.tokens, "rate_bytes_per_s": o.rate,
        "populate_s": t0.elapsed().as_secs_f64(), "scratch": o.scratch.display().to_string()}),
    );
    let inv = Arc::new(Inventory::from_dir(root)?);
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg)?);
    let stores = o
        .homes
        .iter()
        .map(|&h| {
            let opts = TieredOptions {
                ram_budget: 0,
                prefetch_previous: false,
                readers: 4 * most,
                homes: dirs[..h.max(1)].to_vec(),
                home_rate: Some(o.rate),
                // Keep the homes in the page cache: the emulated rate, not the one real disk
                // all the hard links share, is what is measured.
                advice: deltafin::experts::CacheAdvice::Off,
                ..Default::default()
            };
            expert_store(root, inv.clone(), index.clone(), &opts, None)
        })
        .collect::<Result<Vec<_>>>()?;
    // Warm the page cache with every expert once (so the emulated rate is what is timed).
    for &l in &layers {
        let ids: Vec<usize> = want.iter().filter(|x| x.0 == l).map(|x| x.1).collect();
        for c in ids.chunks(k) {
            stores[0].fetch(l, c)?;
        }
    }
    let mut waits: Vec<Vec<f64>> = vec![Vec::new(); o.homes.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); o.homes.len()];
    for run in 0..o.runs.max(1) {
        let mut this = vec![0f64; o.homes.len()];
        for j in 0..o.homes.len() {
            let i = (j + run) % o.homes.len(); // rotate the order between runs
            let t0 = Instant::now();
            for t in 0..o.tokens {
                for &l in &layers {
                    std::hint::black_box(stores[i].fetch(l, &select(t))?);
                }
            }
            this[i] = t0.elapsed().as_secs_f64() * 1e3 / o.tokens.max(1) as f64;
        }
        for (i, &h) in o.homes.iter().enumerate() {
            // Against the ideal from this run's baseline: wait(base) · base / h.
            let ideal = this[0] * o.homes[0].max(1) as f64 / h.max(1) as f64;
            ratios[i].push(ideal / this[i]);
            waits[i].push(this[i]);
            emit(
                serde_json::json!({"figure": "homes_run", "run": run, "homes": h, "expert_wait_ms_per_token": this[i],
                "ideal_ms": ideal, "scaling_vs_ideal": ideal / this[i]}),
            );
        }
    }
    for (i, &h) in o.homes.iter().enumerate() {
        let (w, r) = (Stats::of(waits[i].clone()), Stats::of(ratios[i].clone()));
        let served: Vec<u64> = stores[i]
            .homes()
            .map(|hs| hs.homes().iter().map(|x| x.served()).collect())
            .unwrap_or_default();
        emit(serde_json::json!({"figure": "homes_summary", "homes": h,
            "expert_wait_ms_per_token": {"median": w.median, "min": w.min, "max": w.max},
            "scaling_vs_ideal": {"median": r.median, "min": r.min, "max": r.max},
            "reads_per_home": served}));
    }
    drop(stores);
    let _ = std::fs::remove_dir_all(&o.scratch);
    Ok(())
}
