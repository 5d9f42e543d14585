#![allow(dead_code)]

pub mod reference;
pub mod runner;
pub mod spec;

use std::path::PathBuf;
use std::sync::OnceLock;

use deltafin::models::k3::fixture::{write_nano, NanoOptions};

/// The K3-nano fixture (seed 0), written once per test binary and removed when it exits.
pub fn nano() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = process_tempdir();
        write_nano(&d, &NanoOptions::default()).unwrap();
        d
    })
    .clone()
}

/// A new temporary directory removed when the test process exits. A `TempDir` kept in a
/// static is never dropped, so each test binary would leave its fixture behind in /tmp.
pub fn process_tempdir() -> PathBuf {
    use std::sync::Mutex;
    static DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    static HOOK: std::sync::Once = std::sync::Once::new();
    extern "C" fn remove_all() {
        if let Ok(dirs) = DIRS.lock() {
            for d in dirs.iter() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    // The harness ends the process with `exit`, which runs atexit handlers (pass or fail).
    HOOK.call_once(|| unsafe {
        libc::atexit(remove_all);
    });
    let d = tempfile::tempdir().unwrap().keep();
    DIRS.lock().unwrap().push(d.clone());
    d
}

/// The model in `root` (spine from the shards, all pinned) over the given expert provider.
pub fn model_over(
    root: &std::path::Path,
    experts: std::sync::Arc<dyn deltafin::experts::ExpertProvider>,
) -> deltafin::models::k3::K3Model {
    use std::sync::Arc;
    let cfg = deltafin::models::k3::config::K3Config::from_file(&root.join("config.json")).unwrap();
    let inv = Arc::new(deltafin::checkpoint::Inventory::from_dir(root).unwrap());
    let spine = deltafin::spine::source::Spine::open(
        root,
        inv,
        cfg.num_layers(),
        &candle::Device::Cpu,
        &Default::default(),
    )
    .unwrap();
    deltafin::models::k3::K3Model::load(cfg, Arc::new(spine), experts).unwrap()
}

/// max |a − b| / max(1, max |b|).
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    // Empty or truncated outputs must not pass a comparison.
    assert_eq!(a.len(), b.len(), "compared vectors differ in length");
    assert!(!a.is_empty(), "compared vectors are empty");
    let scale = b.iter().fold(1f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .fold(0f64, |m, (x, y)| m.max((*x as f64 - y).abs()))
        / scale
}

/// max |a − b| / max(1, max |b|) for two f32 vectors.
pub fn rel_err32(a: &[f32], b: &[f32]) -> f64 {
    let bb: Vec<f64> = b.iter().map(|&x| x as f64).collect();
    rel_err(a, &bb)
}

/// Greedy tokens of the model over `inv`'s spine with `experts` as the expert provider.
pub fn generate_with(
    cfg: &deltafin::models::k3::config::K3Config,
    inv: &std::sync::Arc<deltafin::checkpoint::Inventory>,
    experts: std::sync::Arc<dyn deltafin::ExpertProvider>,
    prompt: &[u32],
    max_new: usize,
) -> deltafin::Result<Vec<u32>> {
    let spine = deltafin::spine::source::Spine::open(
        &inv.dir,
        inv.clone(),
        cfg.num_layers(),
        &candle::Device::Cpu,
        &Default::default(),
    )?;
    let m = deltafin::models::k3::K3Model::load(cfg.clone(), std::sync::Arc::new(spine), experts)?;
    let opts = deltafin::GenerateOptions {
        max_new,
        stop_ids: vec![],
        ..Default::default()
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    Ok(deltafin::Generator::new(&m)
        .generate(&mut m.new_state(), prompt, &opts, &stop, |_| {})?
        .generated_ids)
}

/// Runs the `deltafin` binary with `args --model-root root` against the mock hub `hub`
/// (`HF_ENDPOINT`, a hub cache inside the root) and the extra environment `env`.
pub fn deltafin_on_hub(
    hub: &deltafin::hub::mock::MockHub,
    args: &[&str],
    root: &std::path::Path,
    env: &[(&str, &str)],
) -> std::process::Output {
    let mut c = runner::command(env!("CARGO_BIN_EXE_deltafin"));
    c.args(args)
        .arg("--model-root")
        .arg(root)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_CACHE", root.join(".hf-cache"));
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// Runs the `deltafin` binary with `args` (one rayon thread) and returns its output.
pub fn deltafin_cmd(args: &[&str]) -> std::process::Output {
    runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap()
}

/// Runs K3's tools binary `deltafin-k3` with `args` (one rayon thread), asserting success.
pub fn k3_tools_ok(args: &[&str]) -> std::process::Output {
    let out = k3_tools_cmd(args);
    assert!(
        out.status.success(),
        "deltafin-k3 {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs K3's tools binary `deltafin-k3` with `args` (one rayon thread).
pub fn k3_tools_cmd(args: &[&str]) -> std::process::Output {
    runner::command(env!("CARGO_BIN_EXE_deltafin-k3"))
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap()
}

/// `deltafin_cmd`, asserting that it succeeded.
pub fn deltafin_ok(args: &[&str]) -> std::process::Output {
    let out = deltafin_cmd(args);
    assert!(
        out.status.success(),
        "deltafin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
