//! gpt-oss installed from a hub (the mock hub serving the tiny fixture in the hub's layout),
//! through the binary: `setup --stream` copies only the dense tensors (one mapped file) and
//! streams experts into the disk cache by range requests; `run` gives the same tokens as the
//! checkpoint itself; `fetch-experts` completes the cache; a full `setup` downloads the shards.

mod common;

use std::path::Path;
use std::process::Output;

use deltafin::hub::mock::MockHub;
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};

const REPO: &str = "openai/gpt-oss-tiny";

fn deltafin(hub: &MockHub, args: &[&str], root: &Path) -> Output {
    let out = common::deltafin_on_hub(hub, args, root, &[]);
    assert!(
        out.status.success(),
        "deltafin {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap()
}

fn shards(root: &Path) -> usize {
    std::fs::read_dir(root)
        .unwrap()
        .filter(|f| {
            let n = f
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .into_owned();
            n.starts_with("model-") && n.ends_with(".safetensors")
        })
        .count()
}

#[test]
fn stream_install_runs_fetches_and_matches_the_checkpoint() {
    let src = tempfile::tempdir().unwrap();
    // 32 experts per layer: a short run routes to a few of them.
    let shape = GptOssShape {
        experts: 32,
        ..GptOssShape::tiny()
    };
    write_gpt_oss(src.path(), &shape, 11, 3).unwrap();
    let hub = MockHub::start(src.path(), REPO).unwrap();
    let run = ["run", "--prompt-ids", "12,7", "--max-new", "3", "--json"];
    let want = json(&deltafin(&hub, &run, src.path()))["generated_ids"].clone();

    let dst = tempfile::tempdir().unwrap();
    let root = dst.path().join("gpt-oss");
    deltafin(&hub, &["setup", "--stream", "--repo", REPO], &root);
    assert_eq!(shards(&root), 0, "a streaming install downloads no shard");
    let dense = root.join("deltafin-dense/model.safetensors");
    let h = deltafin::checkpoint::header::read_header(&dense).unwrap();
    assert!(
        h.tensors.iter().all(|t| !t.name.contains("mlp.experts.")),
        "the dense file holds no expert"
    );
    assert!(root.join("tokenizer.json").is_file());

    let got = json(&deltafin(&hub, &run, &root));
    assert_eq!(
        got["generated_ids"], want,
        "same tokens from the streaming install"
    );
    let cached = std::fs::read_dir(root.join("experts"))
        .unwrap()
        .filter(|f| {
            f.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".bin")
        })
        .count();
    assert!(cached > 0, "the routed experts were fetched into the cache");

    let missing = |root: &Path| {
        json(&deltafin(&hub, &["fetch-experts", "--dry-run"], root))["missing_experts"]
            .as_u64()
            .unwrap()
    };
    let before = missing(&root);
    assert!(before > 0, "a few tokens do not touch every expert");
    deltafin(&hub, &["fetch-experts", "--layers", "0"], &root);
    let v = json(&deltafin(
        &hub,
        &["fetch-experts", "--dry-run", "--layers", "0"],
        &root,
    ));
    assert_eq!(v["missing_experts"], 0, "{v}");
    deltafin(&hub, &["fetch-experts"], &root);
    assert_eq!(missing(&root), 0);
    let gets = hub.ranged_gets();
    let again = json(&deltafin(&hub, &run, &root));
    assert_eq!(
        again["generated_ids"], want,
        "same tokens from the full cache"
    );
    assert_eq!(
        hub.ranged_gets(),
        gets,
        "a complete cache asks the hub for nothing"
    );

    // A storage home filled with every expert, recorded in the install and read by `run`.
    let home = dst.path().join("drive2");
    let out = deltafin(
        &hub,
        &["populate-home", home.to_str().unwrap(), "--all"],
        &root,
    );
    let r = json(&out);
    assert_eq!(r["experts"], 4 * 32, "{r}");
    assert_eq!(r["recorded"], true, "{r}");
    std::fs::remove_dir_all(root.join("experts")).unwrap();
    let gets = hub.ranged_gets();
    assert_eq!(json(&deltafin(&hub, &run, &root))["generated_ids"], want);
    assert_eq!(hub.ranged_gets(), gets, "every expert came from the home");

    // A full install: the shards themselves, mapped as they are (no store beside them).
    let full = dst.path().join("gpt-oss-full");
    deltafin(&hub, &["setup", "--full", "--repo", REPO], &full);
    assert_eq!(shards(&full), shards(src.path()));
    assert!(!full.join("deltafin-dense").exists());
    assert_eq!(json(&deltafin(&hub, &run, &full))["generated_ids"], want);
}
