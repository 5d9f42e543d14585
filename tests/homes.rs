//! Storage homes: `populate-home` (hottest by router trace, or all; atomic; resumable) and reads
//! spread over several homes give the same bytes and outputs as the plain store.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{ExpertProvider, TieredExperts, TieredOptions};
use deltafin::install::homes::{populate_home, HomeSelection};
use deltafin::installed::expert_store;
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::K3Model;

fn store(root: &Path, homes: Vec<PathBuf>, rate: Option<f64>) -> Arc<TieredExperts> {
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(root).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let opts = TieredOptions {
        ram_budget: 0,
        prefetch_previous: false,
        homes,
        home_rate: rate,
        ..Default::default()
    };
    Arc::new(expert_store(root, inv, index, &opts, None).unwrap())
}

fn model(root: &Path, experts: Arc<TieredExperts>) -> K3Model {
    common::model_over(root, experts)
}

/// Greedy ids and the bits of every step's logits.
fn greedy(m: &K3Model) -> (Vec<u32>, Vec<Vec<u32>>) {
    let mut st = m.new_state();
    let mut l = m
        .forward(&[12, 7, 99, 300], &mut st)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let (mut ids, mut bits) = (vec![], vec![]);
    for _ in 0..12 {
        let n = deltafin::runtime::generate::argmax(&l);
        ids.push(n);
        bits.push(l.iter().map(|x| x.to_bits()).collect());
        l = m.forward(&[n], &mut st).unwrap().to_vec1::<f32>().unwrap();
    }
    (ids, bits)
}

/// A router trace whose expert (l, e) is selected `(e % 7) + 1` times.
fn trace(root: &Path, dir: &Path) -> PathBuf {
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let n = cfg.text().num_experts;
    let mut text = String::new();
    for rep in 0..7 {
        let mut layers = serde_json::Map::new();
        for l in cfg.moe_layers() {
            let ids: Vec<usize> = (0..n).filter(|e| e % 7 >= rep).collect();
            layers.insert(l.to_string(), serde_json::json!(ids));
        }
        text += &format!("{}\n", serde_json::json!({ "layers": layers }));
    }
    let p = dir.join("router_trace.jsonl");
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn populate_home_copies_the_hottest_atomically_and_resumes() {
    let root = common::nano();
    let tmp = tempfile::tempdir().unwrap();
    let t = trace(&root, tmp.path());
    let home = tmp.path().join("home");
    let no = AtomicBool::new(false);
    let sel = HomeSelection::Hottest(5, vec![t.clone()]);
    let r = populate_home(&root, &home, &sel, &no, |_, _| {}).unwrap();
    assert_eq!((r.experts, r.copied), (5, 5));
    assert!(!r.recorded, "a fixture directory has no install.json");
    // The hottest are the experts with e % 7 == 6 (7 selections each), lowest layer first.
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let first = cfg.moe_layers().next().unwrap();
    assert!(home.join(format!("L{first}-E6.bin")).is_file());
    assert!(home.join(format!("L{first}-E6.sum")).is_file());
    let stray: Vec<_> = std::fs::read_dir(&home)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("tmp"))
        .collect();
    assert!(stray.is_empty(), "temporary files left: {stray:?}");
    // The bytes are the expert's span.
    let s = store(&root, vec![], None);
    let want = s.fetch(first, &[6]).unwrap().pop().unwrap();
    assert_eq!(
        std::fs::read(home.join(format!("L{first}-E6.bin"))).unwrap(),
        want.to_vec()
    );
    // A rerun copies nothing; a larger selection copies only the difference.
    let r = populate_home(&root, &home, &sel, &no, |_, _| {}).unwrap();
    assert_eq!(r.copied, 0);
    let r = populate_home(
        &root,
        &home,
        &HomeSelection::Hottest(9, vec![t]),
        &no,
        |_, _| {},
    )
    .unwrap();
    assert_eq!(r.copied, 4);
    // Cancelled before the first expert: an error that says how to finish, nothing copied.
    let yes = AtomicBool::new(true);
    let other = tmp.path().join("other");
    let e = populate_home(&root, &other, &HomeSelection::All, &yes, |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("rerun"), "{e}");
    // Without traces, --hottest is an error that names the flag.
    let e = populate_home(
        &root,
        &other,
        &HomeSelection::Hottest(3, vec![]),
        &no,
        |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("--trace"), "{e}");
}

#[test]
fn homes_give_identical_outputs_and_spread_reads() {
    let root = common::nano();
    let tmp = tempfile::tempdir().unwrap();
    let t = trace(&root, tmp.path());
    let no = AtomicBool::new(false);
    let (full_a, full_b, part) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("hot"),
    );
    populate_home(&root, &full_a, &HomeSelection::All, &no, |_, _| {}).unwrap();
    populate_home(&root, &full_b, &HomeSelection::All, &no, |_, _| {}).unwrap();
    populate_home(
        &root,
        &part,
        &HomeSelection::Hottest(20, vec![t]),
        &no,
        |_, _| {},
    )
    .unwrap();
    let plain = store(&root, vec![], None);
    let want = greedy(&model(&root, plain.clone()));
    assert_eq!(plain.stats().home_experts, 0);
    // A partial home: hot experts from it, the rest from the shards, the same outputs.
    let s = store(&root, vec![part.clone()], None);
    assert_eq!(greedy(&model(&root, s.clone())), want, "partial home");
    let st = s.stats();
    assert!(st.home_experts > 0 && st.shard_experts > 0, "{st:?}");
    // Two full homes, rate-limited so that the queue decides: both serve, outputs equal.
    let s = store(&root, vec![full_a, full_b], Some(20e6));
    assert_eq!(greedy(&model(&root, s.clone())), want, "two homes");
    assert_eq!(s.stats().shard_experts, 0);
    let served: Vec<u64> = s
        .homes()
        .unwrap()
        .homes()
        .iter()
        .map(|h| h.served())
        .collect();
    let total: u64 = served.iter().sum();
    assert!(
        served.iter().all(|&n| n * 10 >= total * 3),
        "reads not spread over the homes: {served:?}"
    );
    // A missing home is an error that says how to make one.
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let inv = Arc::new(Inventory::from_dir(&root).unwrap());
    let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg).unwrap());
    let opts = TieredOptions {
        homes: vec![tmp.path().join("absent")],
        ..Default::default()
    };
    let e = expert_store(&root, inv, index, &opts, None).err().unwrap();
    assert!(e.to_string().contains("populate-home"), "{e}");
}

#[test]
fn cli_populate_home_and_storage_home_flag() {
    let root = common::nano();
    let tmp = tempfile::tempdir().unwrap();
    let t = trace(&root, tmp.path());
    let home = tmp.path().join("home");
    let (r, h, tr) = (
        root.to_str().unwrap(),
        home.to_str().unwrap(),
        t.to_str().unwrap(),
    );
    let out = common::deltafin_ok(&[
        "populate-home",
        h,
        "--model-root",
        r,
        "--hottest",
        "12",
        "--trace",
        tr,
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["copied"], 12, "{v}");
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "run",
            "--prompt-ids",
            "12,7,99",
            "--max-new",
            "6",
            "--json",
            "--model-root",
            r,
        ];
        args.extend(extra);
        serde_json::from_slice(&common::deltafin_ok(&args).stdout).unwrap()
    };
    let plain = run(&[]);
    let homed = run(&["--storage-home", h]);
    assert_eq!(homed["generated_ids"], plain["generated_ids"]);
    // --hottest and --all together are refused by the argument parser.
    let out = common::deltafin_cmd(&[
        "populate-home",
        h,
        "--model-root",
        r,
        "--all",
        "--hottest",
        "3",
    ]);
    assert!(!out.status.success());
}

#[test]
fn populate_home_records_the_home_in_install_json() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("install");
    deltafin::models::k3::fixture::write_nano(&root, &Default::default()).unwrap();
    let manifest = deltafin::installed::manifest_path(&root);
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(
        &manifest,
        r#"{"mode": "full", "repo": "moonshotai/Kimi-K3-nano", "revision": null}"#,
    )
    .unwrap();
    let home = tmp.path().join("drive2");
    let no = AtomicBool::new(false);
    let r = populate_home(&root, &home, &HomeSelection::All, &no, |_, _| {}).unwrap();
    assert!(r.recorded);
    let m = deltafin::installed::read_manifest(&root).unwrap();
    assert_eq!(m.homes, vec![std::fs::canonicalize(&home).unwrap()]);
    // The store finds the home through install.json alone.
    let s = store(&root, vec![], None);
    let cfg = K3Config::from_file(&root.join("config.json")).unwrap();
    let l = cfg.moe_layers().next().unwrap();
    s.fetch(l, &[0, 1, 2]).unwrap();
    assert_eq!(s.stats().home_experts, 3);
    assert_eq!(s.stats().shard_experts, 0);
}
