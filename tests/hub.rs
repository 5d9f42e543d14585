//! The hub tier against the mock hub: cold cache, faults, concurrency, restart.

mod common;

use std::sync::Arc;

use common::nano;
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{
    CacheAdvice, DiskCache, ExpertProvider, ShardExperts, TieredExperts, TieredOptions,
};
use deltafin::hub::mock::{Fault, MockHub};
use deltafin::hub::HubRepo;
use deltafin::models::k3::config::K3Config;

const PROMPT: [u32; 4] = [5, 77, 123, 9];
const REPO: &str = "moonshotai/Kimi-K3-nano";

struct Env {
    cfg: K3Config,
    inv: Arc<Inventory>,
    index: Arc<ExpertIndex>,
    hub: MockHub,
}

fn env() -> Env {
    let dir = nano();
    let cfg = K3Config::from_file(&dir.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(&dir).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let hub = MockHub::start(&dir, REPO).unwrap();
    Env {
        cfg,
        inv,
        index,
        hub,
    }
}

fn hub_provider(e: &Env, cache: &DiskCache, attempts: usize) -> Arc<TieredExperts> {
    let opts = TieredOptions {
        ram_budget: 0,
        readers: 4,
        advice: CacheAdvice::Auto,
        ..Default::default()
    };
    let mut repo = HubRepo::new(REPO, None, Some(e.hub.endpoint())).unwrap();
    repo.attempts = attempts;
    repo.backoff = std::time::Duration::from_millis(10);
    Arc::new(
        TieredExperts::new(e.index.clone(), None, Some(cache.clone()), &opts)
            .unwrap()
            .with_hub(Arc::new(repo), e.inv.clone())
            .unwrap(),
    )
}

fn tokens(e: &Env, experts: Arc<dyn ExpertProvider>) -> deltafin::Result<Vec<u32>> {
    common::generate_with(&e.cfg, &e.inv, experts, &PROMPT, 6)
}

fn want(e: &Env) -> Vec<u32> {
    tokens(
        e,
        Arc::new(ShardExperts::new(e.inv.clone(), e.index.clone())),
    )
    .unwrap()
}

fn assert_clean(dir: &std::path::Path) {
    for f in std::fs::read_dir(dir).unwrap() {
        let name = f.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            !name.ends_with(".tmp"),
            "partial file {name} left in the cache"
        );
    }
}

#[test]
fn cold_cache_then_restart() {
    let e = env();
    let want = want(&e);
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    let p = hub_provider(&e, &cache, 3);
    assert_eq!(tokens(&e, p.clone()).unwrap(), want);
    let st = p.stats();
    assert!(st.hub_experts > 0);
    // Adjacent experts are coalesced: fewer range requests than experts fetched.
    assert!(st.hub_requests < st.hub_experts, "{st:?}");
    assert_eq!(e.hub.ranged_gets() as u64, st.hub_requests);
    assert_clean(dir.path());
    // Restart with the warm cache: no new requests.
    let before = e.hub.gets();
    let p2 = hub_provider(&e, &cache, 3);
    assert_eq!(tokens(&e, p2.clone()).unwrap(), want);
    assert_eq!(e.hub.gets(), before);
    assert_eq!(p2.stats().hub_experts, 0);
}

#[test]
fn faults_end_in_correct_tokens_or_clear_errors() {
    let e = env();
    let want = want(&e);
    for fault in [
        Fault::DropMidBody,
        Fault::Status(503),
        Fault::ShortBody,
        Fault::Slow(std::time::Duration::from_millis(2)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
        e.hub.push_fault(fault);
        assert_eq!(
            tokens(&e, hub_provider(&e, &cache, 3)).unwrap(),
            want,
            "{fault:?}"
        );
        assert_clean(dir.path());
    }
    // A hub that keeps failing: a clear error naming layer, expert and URL; nothing cached.
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    for _ in 0..64 {
        e.hub.push_fault(Fault::Status(500));
    }
    let err = tokens(&e, hub_provider(&e, &cache, 2))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("layer") && err.contains("expert") && err.contains("/resolve/"),
        "{err}"
    );
    assert_clean(dir.path());
    e.hub.clear_faults();
}

#[test]
fn corrupted_cache_files_are_refetched() {
    let e = env();
    let want = want(&e);
    let dir = tempfile::tempdir().unwrap();
    let mut cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    cache.verify = true;
    assert_eq!(tokens(&e, hub_provider(&e, &cache, 3)).unwrap(), want);
    // Flip a byte in every cached expert (same size), truncate one more.
    let mut n = 0;
    for f in std::fs::read_dir(dir.path()).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "bin") {
            let mut b = std::fs::read(&p).unwrap();
            if n == 0 {
                b.truncate(b.len() - 1);
            } else {
                b[7] ^= 0x55;
            }
            std::fs::write(&p, b).unwrap();
            n += 1;
        }
    }
    let before = e.hub.gets();
    let p = hub_provider(&e, &cache, 3);
    assert_eq!(tokens(&e, p.clone()).unwrap(), want);
    assert!(e.hub.gets() > before, "corrupted files were refetched");
    assert_clean(dir.path());
}

/// Every published expert gets its checksum (verification on or off); with verification on, a
/// cache file whose checksum is missing is a miss and is refetched.
#[test]
fn checksums_are_always_written_and_a_missing_one_is_a_miss() {
    let e = env();
    let want = want(&e);
    let dir = tempfile::tempdir().unwrap();
    let plain = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    assert_eq!(tokens(&e, hub_provider(&e, &plain, 3)).unwrap(), want);
    let files: Vec<std::path::PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    let bins: Vec<_> = files
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "bin"))
        .collect();
    assert!(!bins.is_empty());
    for b in &bins {
        assert!(
            b.with_extension("sum").is_file(),
            "{} has no checksum",
            b.display()
        );
    }
    for b in &bins {
        std::fs::remove_file(b.with_extension("sum")).unwrap();
    }
    let mut verified = plain.clone();
    verified.verify = true;
    let before = e.hub.gets();
    assert_eq!(tokens(&e, hub_provider(&e, &verified, 3)).unwrap(), want);
    assert!(
        e.hub.gets() > before,
        "files without a checksum were refetched"
    );
    for b in &bins {
        assert!(b.with_extension("sum").is_file());
    }
}

#[test]
fn concurrent_requests_fetch_once() {
    let e = env();
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    let p = hub_provider(&e, &cache, 3);
    let l = e.cfg.moe_layers().next().unwrap();
    let before = e.hub.ranged_gets();
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| p.fetch(l, &[3]).unwrap().remove(0).to_vec()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        e.hub.ranged_gets() - before,
        1,
        "one range request for one expert"
    );
    let direct = ShardExperts::new(e.inv.clone(), e.index.clone())
        .read_span(l, 3)
        .unwrap();
    assert!(results.iter().all(|r| *r == direct));
}

#[test]
fn adjacent_experts_share_one_request() {
    let e = env();
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::new(dir.path(), CacheAdvice::Auto).unwrap();
    let p = hub_provider(&e, &cache, 3);
    let l = e.cfg.moe_layers().next().unwrap();
    // Find two experts whose spans are adjacent in the shard.
    let mut by_start: Vec<(u64, usize)> = (0..e.cfg.text().num_experts)
        .map(|x| (e.index.span(l, x).unwrap().start(), x))
        .collect();
    by_start.sort();
    let (a, b) = (by_start[0].1, by_start[1].1);
    let before = e.hub.ranged_gets();
    let got = p.fetch(l, &[a, b]).unwrap();
    assert_eq!(e.hub.ranged_gets() - before, 1);
    let direct = ShardExperts::new(e.inv.clone(), e.index.clone());
    assert_eq!(got[0].to_vec(), direct.read_span(l, a).unwrap());
    assert_eq!(got[1].to_vec(), direct.read_span(l, b).unwrap());
}
