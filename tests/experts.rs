//! The tiered expert store gives the same tokens from every tier.

mod common;

use std::sync::Arc;

use common::nano;
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{CacheAdvice, DiskCache, ExpertProvider, TieredExperts, TieredOptions};
use deltafin::models::k3::config::K3Config;

const PROMPT: [u32; 4] = [5, 77, 123, 9];

struct Parts {
    cfg: K3Config,
    inv: Arc<Inventory>,
    index: Arc<ExpertIndex>,
}

fn parts() -> Parts {
    let dir = nano();
    let cfg = K3Config::from_file(&dir.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(&dir).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    Parts { cfg, inv, index }
}

fn tokens(p: &Parts, experts: Arc<dyn ExpertProvider>) -> Vec<u32> {
    common::generate_with(&p.cfg, &p.inv, experts, &PROMPT, 10).unwrap()
}

fn opts(ram: usize) -> TieredOptions {
    TieredOptions {
        ram_budget: ram,
        readers: 4,
        advice: CacheAdvice::Auto,
        ..Default::default()
    }
}

/// Tokens with the simplest provider (shards into an in-RAM map).
fn reference_tokens(p: &Parts) -> Vec<u32> {
    let simple = deltafin::experts::ShardExperts::new(p.inv.clone(), p.index.clone());
    tokens(p, Arc::new(simple))
}

#[test]
fn same_tokens_from_every_tier() {
    let p = parts();
    let want = reference_tokens(&p);

    // Shards only (RAM tier disabled).
    let shards =
        Arc::new(TieredExperts::new(p.index.clone(), Some(p.inv.clone()), None, &opts(0)).unwrap());
    assert_eq!(tokens(&p, shards.clone()), want);
    assert!(shards.stats().shard_experts > 0);
    assert_eq!(shards.stats().ram_experts, 0);

    // RAM tier: the second generation is served from RAM.
    let ram = Arc::new(
        TieredExperts::new(p.index.clone(), Some(p.inv.clone()), None, &opts(1 << 30)).unwrap(),
    );
    assert_eq!(tokens(&p, ram.clone()), want);
    let reads = ram.stats().shard_experts;
    assert_eq!(tokens(&p, ram.clone()), want);
    assert_eq!(
        ram.stats().shard_experts,
        reads,
        "second run read nothing from the shards"
    );
    assert!(ram.stats().ram_experts > 0);

    // Disk cache: warm it from the shards, then serve with no shards at all ("after a restart").
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(cache_dir.path(), CacheAdvice::Auto).unwrap();
    let warmer = TieredExperts::new(
        p.index.clone(),
        Some(p.inv.clone()),
        Some(cache.clone()),
        &opts(0),
    )
    .unwrap();
    for l in p.cfg.moe_layers() {
        let all: Vec<usize> = (0..p.cfg.text().num_experts).collect();
        warmer.warm_disk_cache(l, &all).unwrap();
    }
    let disk =
        Arc::new(TieredExperts::new(p.index.clone(), None, Some(cache.clone()), &opts(0)).unwrap());
    assert_eq!(tokens(&p, disk.clone()), want);
    assert!(disk.stats().disk_experts > 0);
    assert_eq!(disk.stats().shard_experts, 0);

    // A truncated cache file is deleted and refetched from the shards.
    let l = p.cfg.moe_layers().next().unwrap();
    for e in 0..p.cfg.text().num_experts {
        let path = cache.path(l, e);
        let b = std::fs::read(&path).unwrap();
        std::fs::write(&path, &b[..b.len() / 2]).unwrap();
    }
    let healed = Arc::new(
        TieredExperts::new(
            p.index.clone(),
            Some(p.inv.clone()),
            Some(cache.clone()),
            &opts(0),
        )
        .unwrap(),
    );
    assert_eq!(tokens(&p, healed.clone()), want);
    assert!(healed.stats().shard_experts > 0);
    // With no shards, the missing expert is a clear error naming the layer.
    let e = (0..p.cfg.text().num_experts)
        .find(|&e| !cache.path(l, e).exists())
        .unwrap();
    let none = TieredExperts::new(p.index.clone(), None, Some(cache.clone()), &opts(0)).unwrap();
    let err = none.fetch(l, &[e]).unwrap_err().to_string();
    assert!(err.contains(&format!("layer {l}")), "{err}");
    // No temporary files are left in the cache.
    for f in std::fs::read_dir(cache_dir.path()).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            (name.ends_with(".bin") || name.ends_with(".sum")) && !name.starts_with('.'),
            "{name}"
        );
    }
}

#[test]
fn prefetch_hits_and_same_tokens() {
    let p = parts();
    let want = reference_tokens(&p);
    let mut o = opts(0);
    o.prefetch_previous = true;
    let pf = Arc::new(TieredExperts::new(p.index.clone(), Some(p.inv.clone()), None, &o).unwrap());
    assert_eq!(tokens(&p, pf.clone()), want);
    let s = pf.stats();
    assert!(s.prefetch_issued > 0 && s.prefetch_hits > 0, "{s:?}");
    assert!(s.prefetch_hits <= s.shard_experts);
    o.prefetch_previous = false;
    let off = Arc::new(TieredExperts::new(p.index.clone(), Some(p.inv.clone()), None, &o).unwrap());
    assert_eq!(tokens(&p, off.clone()), want);
    assert_eq!(off.stats().prefetch_issued, 0);
}

#[test]
fn router_trace_has_one_line_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("router_trace.jsonl");
    let mut m = deltafin::models::k3::K3Model::from_dir(&nano(), &candle::Device::Cpu).unwrap();
    let rt = std::sync::Arc::new(deltafin::runtime::observers::RouterTrace::create(&path).unwrap());
    m.observe(rt.clone());
    let mut st = m.new_state();
    let mut trace = deltafin::runtime::observe::RouteTrace::new();
    m.forward_traced(&PROMPT, &mut st, Some(&mut trace))
        .unwrap();
    m.forward(&[1], &mut st).unwrap();
    rt.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), PROMPT.len() + 1);
    let moe: Vec<usize> = p_moe_layers();
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["pos"], i);
        assert_eq!(l["layers"].as_object().unwrap().len(), moe.len());
    }
    // The trace agrees with the routes the model reports.
    let (layer, routes) = &trace[0];
    assert_eq!(
        lines[2]["layers"][layer.to_string()],
        serde_json::json!(routes[2].experts)
    );
}

fn p_moe_layers() -> Vec<usize> {
    parts().cfg.moe_layers().collect()
}
