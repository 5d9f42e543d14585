//! `setup` / `fetch-experts` / `warm-cache` / `run` against the mock hub, through the binary.

mod common;

use std::path::Path;
use std::process::Output;

use deltafin::hub::mock::MockHub;
use deltafin::models::k3::fixture::{write_nano, NanoOptions};
use deltafin::spine::layer::parse_header_full;

const REPO: &str = "moonshotai/Kimi-K3-nano";

/// Runs the binary against the hub and asserts it succeeded.
fn deltafin(hub: &MockHub, args: &[&str], root: &Path, extra_env: &[(&str, &str)]) -> Output {
    let out = common::deltafin_on_hub(hub, args, root, extra_env);
    assert!(
        out.status.success(),
        "deltafin {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn ids(out: &Output) -> serde_json::Value {
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["generated_ids"].clone()
}

#[test]
fn stream_install_then_run_fetch_and_warm() {
    let src = tempfile::tempdir().unwrap();
    write_nano(src.path(), &NanoOptions::default()).unwrap();
    let hub = MockHub::start(src.path(), REPO).unwrap();
    let run = ["run", "--prompt-ids", "12,7,99", "--max-new", "6", "--json"];
    let want = ids(&deltafin(&hub, &run, src.path(), &[]));

    // Streaming install: metadata, headers and the spine; no shards.
    let dst = tempfile::tempdir().unwrap();
    let root = dst.path().join("k3");
    deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root, &[]);
    assert!(root.join("deltafin-spine/bf16/layer-000.bin").is_file());
    // The install is pinned to the commit `main` named at setup; everything after asks for it.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("deltafin-meta/install.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest["revision"],
        deltafin::hub::mock::MOCK_COMMIT,
        "{manifest}"
    );
    let asked_at_setup = hub.revisions().len();
    assert!(!root.join("model-00001-of-000004.safetensors").exists());
    let out = deltafin(&hub, &run, &root, &[]);
    assert_eq!(ids(&out), want, "same tokens from the streaming install");
    let later: Vec<String> = hub.revisions()[asked_at_setup..].to_vec();
    assert!(!later.is_empty());
    assert!(
        later.iter().all(|r| r == deltafin::hub::mock::MOCK_COMMIT),
        "after setup every request names the pinned commit: {later:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("experts: streaming install"));
    for f in std::fs::read_dir(root.join("experts")).unwrap() {
        let n = f.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            (n.ends_with(".bin") || n.ends_with(".sum") || n == "source.json")
                && !n.starts_with('.'),
            "no partial files: {n}"
        );
    }

    // The int8 spine converts on a streaming install (no shards: from its BF16 store), to the
    // same bytes as from the checkpoint itself.
    deltafin(&hub, &["convert-spine-int8"], &root, &[]);
    let st = common::runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args(["convert-spine-int8", "--model-root"])
        .arg(src.path())
        .status()
        .unwrap();
    assert!(st.success());
    for f in ["layer-000.bin", "layer-005.bin", "global.bin", "embed.bin"] {
        let a = std::fs::read(root.join("deltafin-spine/int8").join(f)).unwrap();
        let b = std::fs::read(src.path().join("deltafin-spine/int8").join(f)).unwrap();
        // The same tensors and bytes; only the recorded source differs (the install's shards
        // are identified by the hub's ETags, the plain directory's by their headers).
        let (ea, sa) = parse_header_full(&a, a.len(), Path::new(f)).unwrap();
        let (eb, sb) = parse_header_full(&b, b.len(), Path::new(f)).unwrap();
        assert_eq!(ea, eb, "{f}: the same tensors");
        let start = ea.iter().map(|e| e.offset).min().unwrap();
        assert!(
            a[start..] == b[start..],
            "{f} differs between the streaming install and the checkpoint"
        );
        assert!(sa.is_some() && sb.is_some() && sa != sb, "{sa:?} {sb:?}");
    }
    // The rest of this test compares BF16 tokens.
    std::fs::remove_dir_all(root.join("deltafin-spine/int8")).unwrap();

    // fetch-experts: dry run, then one layer, then everything.
    let dry = deltafin(&hub, &["fetch-experts", "--dry-run"], &root, &[]);
    let v: serde_json::Value = serde_json::from_slice(&dry.stdout).unwrap();
    let missing = v["missing_experts"].as_u64().unwrap();
    assert!(missing > 0 && missing < 9 * 16, "{v}");
    deltafin(&hub, &["fetch-experts", "--layers", "1-2"], &root, &[]);
    let v: serde_json::Value = serde_json::from_slice(
        &deltafin(
            &hub,
            &["fetch-experts", "--dry-run", "--layers", "1,2"],
            &root,
            &[],
        )
        .stdout,
    )
    .unwrap();
    assert_eq!(v["missing_experts"], 0);

    // warm-cache: a plan from a router trace, then fetch the top 3.
    let trace = dst.path().join("trace.jsonl");
    let tr = trace.to_str().unwrap();
    deltafin(
        &hub,
        &[
            "run",
            "--prompt-ids",
            "5,6,7,8",
            "--max-new",
            "4",
            "--router-trace",
            tr,
        ],
        src.path(),
        &[],
    );
    let absent = |o: &Output| -> usize {
        let e = String::from_utf8_lossy(&o.stderr);
        let line = e
            .lines()
            .find(|l| l.contains("absent experts were selected"))
            .unwrap()
            .to_string();
        line.split_whitespace().next().unwrap().parse().unwrap()
    };
    let plan = deltafin(&hub, &["warm-cache", "--trace", tr], &root, &[]);
    let before = absent(&plan);
    assert!(before >= 3, "the trace selects experts outside layers 1-2");
    let first: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&plan.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    deltafin(
        &hub,
        &["warm-cache", "--trace", tr, "--fetch", "3"],
        &root,
        &[],
    );
    let after = absent(&deltafin(&hub, &["warm-cache", "--trace", tr], &root, &[]));
    assert_eq!(after, before - 3);
    let top = root.join(format!(
        "experts/L{}-E{}.bin",
        first["layer"], first["expert"]
    ));
    assert!(top.is_file(), "the most-selected absent expert was fetched");

    deltafin(&hub, &["fetch-experts"], &root, &[]);
    let v: serde_json::Value =
        serde_json::from_slice(&deltafin(&hub, &["fetch-experts", "--dry-run"], &root, &[]).stdout)
            .unwrap();
    assert_eq!(v["missing_experts"], 0);
    assert_eq!(ids(&deltafin(&hub, &run, &root, &[])), want);

    // A storage home on a streaming install: filled from the install's expert cache, recorded
    // in install.json, used by `run` without a flag, and kept when setup runs again.
    let home = dst.path().join("drive2");
    let h = home.to_str().unwrap();
    let out = deltafin(&hub, &["populate-home", h, "--all"], &root, &[]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["recorded"], true, "{r}");
    let homes = |root: &Path| -> serde_json::Value {
        serde_json::from_slice::<serde_json::Value>(
            &std::fs::read(root.join("deltafin-meta/install.json")).unwrap(),
        )
        .unwrap()["homes"]
            .clone()
    };
    let recorded = homes(&root);
    assert_eq!(recorded.as_array().map(|a| a.len()), Some(1), "{recorded}");
    let mut with_stats = run.to_vec();
    with_stats.push("--stats");
    let out = deltafin(&hub, &with_stats, &root, &[]);
    assert_eq!(ids(&out), want);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"home_experts\":") && !err.contains("\"home_experts\":0"),
        "{err}"
    );
    deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root, &[]);
    assert_eq!(homes(&root), recorded, "setup again keeps the homes");
}

#[test]
fn setup_plans_by_free_space_and_full_install_runs() {
    let src = tempfile::tempdir().unwrap();
    write_nano(src.path(), &NanoOptions::default()).unwrap();
    let hub = MockHub::start(src.path(), REPO).unwrap();
    let dst = tempfile::tempdir().unwrap();
    let root = dst.path().join("k3");
    let plan = |free: &str| -> serde_json::Value {
        let out = deltafin(
            &hub,
            &["setup", "--dry-run", "--repo", REPO],
            &root,
            &[("DELTAFIN_DISK_FREE", free)],
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let small = plan("1000");
    assert_eq!(small["mode"], "stream", "{small}");
    // A dry run writes nothing under the model root (not even the metadata it read).
    assert!(!root.exists(), "--dry-run created {}", root.display());
    let big = plan("100000000000");
    assert_eq!(big["mode"], "full", "{big}");
    assert!(big["full_bytes"].as_u64() > big["stream_bytes"].as_u64());
    deltafin(
        &hub,
        &["setup", "--repo", REPO],
        &root,
        &[("DELTAFIN_DISK_FREE", "100000000000")],
    );
    assert!(root.join("model-00001-of-000004.safetensors").is_file());
    let run = ["run", "--prompt-ids", "12,7,99", "--max-new", "6", "--json"];
    assert_eq!(
        ids(&deltafin(&hub, &run, &root, &[])),
        ids(&deltafin(&hub, &run, src.path(), &[]))
    );
}
