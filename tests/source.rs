//! Every byte on disk tied to its source: a re-upload (a new commit on `main` that changes one
//! shard's values but not its header) is noticed by `setup`, the spine store is rebuilt, cached
//! experts of the changed shard are fetched again, stale stores are never preferred, and a full
//! install's downloads are verified against the hub's SHA-256 ETags and resumed only from the
//! same upload.

mod common;

use std::path::Path;
use std::process::Output;

use deltafin::checkpoint::source::{read_hub_shards, sha256_hex};
use deltafin::checkpoint::{ExpertIndex, Inventory, Source};
use deltafin::hub::mock::MockHub;
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::fixture::{write_nano, NanoOptions};
use deltafin::spine::convert::{store_state, SpineFormat, StoreState};

const REPO: &str = "moonshotai/Kimi-K3-nano";
const COMMIT_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

use common::deltafin_on_hub as deltafin;

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A copy of `a` in `b` whose shard `file` has one data byte changed (same header, same size):
/// what a re-upload of new values looks like.
fn reupload(a: &Path, b: &Path, file: &str, at: u64) {
    std::fs::create_dir_all(b).unwrap();
    for e in std::fs::read_dir(a).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::copy(e.path(), b.join(e.file_name())).unwrap();
        }
    }
    let p = b.join(file);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[at as usize] ^= 0x11;
    std::fs::write(&p, bytes).unwrap();
}

fn expert_bytes(dir: &Path, l: usize, e: usize) -> Vec<u8> {
    let inv = Inventory::from_dir(dir).unwrap();
    let cfg = K3Config::from_file(&dir.join("config.json")).unwrap();
    let index = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
    let span = &index.spans[l][e];
    let shard = std::fs::read(dir.join(&inv.shards[span.shard].file)).unwrap();
    span.parts
        .iter()
        .flat_map(|&(s, n)| shard[s as usize..(s + n) as usize].to_vec())
        .collect()
}

#[test]
fn a_reupload_rebuilds_the_spine_and_refetches_its_experts() {
    let base = tempfile::tempdir().unwrap();
    let a = base.path().join("a");
    write_nano(&a, &NanoOptions::default()).unwrap();
    let hub = MockHub::start(&a, REPO).unwrap();
    let root = base.path().join("k3");
    ok(
        deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root, &[]),
        "setup",
    );
    let run = ["run", "--prompt-ids", "12,7,99", "--max-new", "3", "--json"];
    ok(deltafin(&hub, &run, &root, &[]), "run at A");
    let cache = deltafin::experts::DiskCache::new(
        &root.join("experts"),
        deltafin::experts::CacheAdvice::Off,
    )
    .unwrap();
    let cached = cache.cached_experts();
    assert!(cached.len() > 4, "{cached:?}");
    let fp_a = Source::of(&Inventory::from_dir(&root).unwrap()).fingerprint();

    // Commit B changes one byte of a cached expert's shard.
    let inv = Inventory::from_dir(&a).unwrap();
    let cfg = K3Config::from_file(&a.join("config.json")).unwrap();
    let index = ExpertIndex::derive_k3(&inv, &cfg).unwrap();
    let (l, e) = cached[0];
    let span = &index.spans[l][e];
    let changed = inv.shards[span.shard].file.clone();
    let b = base.path().join("b");
    reupload(&a, &b, &changed, span.parts[0].0);
    assert_ne!(expert_bytes(&a, l, e), expert_bytes(&b, l, e));
    hub.push_commit(COMMIT_B, &b);

    let out = ok(
        deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root, &[]),
        "setup at B",
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("deltafin-meta/install.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["revision"], COMMIT_B, "{manifest}");
    let hub_shards = read_hub_shards(&root);
    let new_sum = sha256_hex(&std::fs::read(b.join(&changed)).unwrap());
    assert_eq!(hub_shards[&changed].etag, new_sum, "the hub's SHA-256 ETag");
    let fp_b = Source::of(&Inventory::from_dir(&root).unwrap()).fingerprint();
    assert_ne!(fp_a, fp_b, "the changed shard changes the fingerprint");
    assert_eq!(manifest["fingerprint"], fp_b.as_str());
    // The spine store was rebuilt from B.
    assert_eq!(
        store_state(&root, SpineFormat::Bf16, cfg.num_layers(), &fp_b),
        StoreState::Current
    );
    // Experts of the changed shard are gone; the others stay.
    let after = cache.cached_experts();
    let of_changed = |&(l, e): &(usize, usize)| index.spans[l][e].shard == span.shard;
    assert!(!after.iter().any(of_changed), "{after:?}");
    assert_eq!(
        after.len(),
        cached.iter().filter(|x| !of_changed(x)).count(),
        "experts of unchanged shards are kept:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doctor = deltafin(&hub, &["doctor"], &root, &[]);
    let text = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        text.contains("all read from this checkpoint's shards"),
        "{text}"
    );
    // The next run fetches the changed expert again, from B.
    ok(deltafin(&hub, &run, &root, &[]), "run at B");
    assert_eq!(
        std::fs::read(cache.path(l, e)).unwrap(),
        expert_bytes(&b, l, e)
    );
    // The cache records B; a cache with no record is of unknown origin and is emptied.
    std::fs::remove_file(root.join("experts/source.json")).unwrap();
    let text =
        String::from_utf8_lossy(&deltafin(&hub, &["doctor"], &root, &[]).stdout).into_owned();
    assert!(text.contains("were read from another source"), "{text}");
}

#[test]
fn full_install_verifies_downloads_and_never_prefers_a_stale_store() {
    let base = tempfile::tempdir().unwrap();
    let a = base.path().join("a");
    write_nano(&a, &NanoOptions::default()).unwrap();
    let hub = MockHub::start(&a, REPO).unwrap();
    let root = base.path().join("k3");
    let big = [("DELTAFIN_DISK_FREE", "100000000000")];
    ok(
        deltafin(&hub, &["setup", "--full", "--repo", REPO], &root, &big),
        "setup",
    );
    let rec = read_hub_shards(&root);
    assert!(
        !rec.is_empty() && rec.values().all(|r| r.verified),
        "{rec:?}"
    );
    ok(deltafin(&hub, &["convert-spine-int8"], &root, &[]), "int8");

    // B changes a byte of the second shard.
    let inv = Inventory::from_dir(&a).unwrap();
    let shard = inv.shards[1].clone();
    let b = base.path().join("b");
    reupload(&a, &b, &shard.file, 8 + shard.header_len + 1);
    hub.push_commit(COMMIT_B, &b);
    let b_bytes = std::fs::read(b.join(&shard.file)).unwrap();
    let b_etag = sha256_hex(&b_bytes);
    // A partial download of A's upload is never resumed, and a corrupt partial of B's is
    // caught by the SHA-256 check (and removed).
    let a_etag = sha256_hex(&std::fs::read(a.join(&shard.file)).unwrap());
    let old_part = root.join(deltafin::install::part_name(&shard.file, &a_etag));
    std::fs::write(&old_part, &b_bytes[..100]).unwrap();
    let bad_part = root.join(deltafin::install::part_name(&shard.file, &b_etag));
    let mut garbage = b_bytes[..b_bytes.len() / 2].to_vec();
    garbage[10] ^= 0xff;
    std::fs::write(&bad_part, &garbage).unwrap();
    // The shard in place (A's, same size) is not B's: it must be downloaded again.
    std::fs::remove_file(root.join(&shard.file)).unwrap();
    let out = deltafin(&hub, &["setup", "--full", "--repo", REPO], &root, &big);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not match the hub's SHA-256"),
        "{err}"
    );
    assert!(!old_part.exists() && !bad_part.exists());
    // Resumed: A's shard 2 is back in place, so the record must be what decides.
    std::fs::copy(a.join(&shard.file), root.join(&shard.file)).unwrap();
    ok(
        deltafin(&hub, &["setup", "--full", "--repo", REPO], &root, &big),
        "setup at B",
    );
    assert!(std::fs::read(root.join(&shard.file)).unwrap() == b_bytes);
    let rec = read_hub_shards(&root);
    assert_eq!(rec[&shard.file].etag, b_etag);

    // The int8 store was built from A: `--spine auto` does not use it, `--spine int8` says why.
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let fp = Source::of(&Inventory::from_dir(&root).unwrap()).fingerprint();
    assert!(matches!(
        store_state(&root, SpineFormat::Int8, cfg.num_layers(), &fp),
        StoreState::Stale { .. }
    ));
    let run = ["run", "--prompt-ids", "12,7,99", "--max-new", "3", "--json"];
    let auto = ok(deltafin(&hub, &run, &root, &[]), "run");
    let v: serde_json::Value = serde_json::from_slice(&auto.stdout).unwrap();
    let want = ok(deltafin(&hub, &run, &b, &[]), "run on B");
    let w: serde_json::Value = serde_json::from_slice(&want.stdout).unwrap();
    assert_eq!(v["generated_ids"], w["generated_ids"], "B's BF16 spine");
    let int8 = deltafin(&hub, &[&run[..], &["--spine", "int8"]].concat(), &root, &[]);
    let err = String::from_utf8_lossy(&int8.stderr);
    assert!(
        !int8.status.success() && err.contains("built from another checkpoint"),
        "{err}"
    );
    let doctor =
        String::from_utf8_lossy(&deltafin(&hub, &["doctor"], &root, &[]).stdout).into_owned();
    assert!(doctor.contains("built from another checkpoint"), "{doctor}");
    ok(
        deltafin(&hub, &["convert-spine-int8"], &root, &[]),
        "int8 again",
    );
    assert_eq!(
        store_state(&root, SpineFormat::Int8, cfg.num_layers(), &fp),
        StoreState::Current
    );
}
