//! Crashes at random points: `setup --stream`, `fetch-experts`, `setup --full` (shard downloads,
//! SHA-256 checks, the BF16 conversion) and `convert-spine-int8` are killed (SIGKILL) at random
//! moments, 65 times in all; after each kill `doctor` must not report
//! a failure, and finishing the job afterwards must give files byte-identical to a run that was
//! never interrupted.

#[path = "common/runner.rs"]
mod runner;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use deltafin::checkpoint::rng::Rng;
use deltafin::hub::mock::MockHub;
use deltafin::models::k3::fixture::{write_nano, NanoOptions};

const REPO: &str = "moonshotai/Kimi-K3-nano";

fn cmd(hub: &MockHub, args: &[&str], root: &Path) -> Command {
    let mut c = runner::command(env!("CARGO_BIN_EXE_deltafin"));
    c.args(args)
        .arg("--model-root")
        .arg(root)
        .env("HF_ENDPOINT", hub.endpoint())
        .env("HF_HUB_CACHE", root.join(".hf-cache"))
        .env("DELTAFIN_DISK_FREE", "100000000000")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Runs the command to the end; returns how long it took.
fn finish(hub: &MockHub, args: &[&str], root: &Path) -> Duration {
    let t0 = std::time::Instant::now();
    let st = cmd(hub, args, root).status().unwrap();
    assert!(st.success(), "deltafin {args:?} failed after a crash");
    t0.elapsed()
}

/// Starts the command and kills it after a random delay within `span` (the job's own duration,
/// so the kills land while it works).
fn kill_at_random(hub: &MockHub, args: &[&str], root: &Path, rng: &mut Rng, span: Duration) {
    let mut child = cmd(hub, args, root).spawn().unwrap();
    let us = span.as_micros().max(1000) as u64;
    std::thread::sleep(Duration::from_micros(rng.below(us)));
    let _ = child.kill();
    let _ = child.wait();
}

/// Every regular file under `root` (path → bytes), leaving out the hub client's own cache, the
/// lock file, and temporaries (the next writer sweeps those).
fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if name != ".hf-cache" {
                    stack.push(p);
                }
            } else if name != "lock" && !deltafin::fsio::atomic::is_temp_name(&name) {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

fn doctor_ok(root: &Path) {
    let out = runner::command(env!("CARGO_BIN_EXE_deltafin"))
        .args(["doctor", "--model-root"])
        .arg(root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("FAIL"), "doctor after a crash:\n{text}");
}

#[test]
fn killed_writers_leave_a_root_that_resumes_to_identical_files() {
    let src = tempfile::tempdir().unwrap();
    write_nano(src.path(), &NanoOptions::default()).unwrap();
    let hub = MockHub::start(src.path(), REPO).unwrap();
    let setup = ["setup", "--stream", "--repo", REPO];
    let fetch = ["fetch-experts"];
    let int8 = ["convert-spine-int8"];
    // The references: every job once, never interrupted. The int8 conversion runs on a plain
    // checkpoint directory (a copy of the source).
    let clean = tempfile::tempdir().unwrap();
    let want_root = clean.path().join("k3");
    let t_setup = finish(&hub, &setup, &want_root);
    let t_fetch = finish(&hub, &fetch, &want_root);
    let want = files(&want_root);
    assert!(want.keys().any(|k| k.starts_with("experts/")));
    let plain = |to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(src.path()).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    let want_plain_root = clean.path().join("plain");
    plain(&want_plain_root);
    let t_int8 = finish(&hub, &int8, &want_plain_root);
    let want_plain = files(&want_plain_root);
    let full = ["setup", "--full", "--repo", REPO];
    let want_full_root = clean.path().join("full");
    let t_full = finish(&hub, &full, &want_full_root);
    let want_full = files(&want_full_root);
    assert!(want_full.keys().any(|k| k.ends_with(".safetensors")));
    assert!(want_plain
        .keys()
        .any(|k| k.starts_with("deltafin-spine/int8/")));

    let same = |got: BTreeMap<String, Vec<u8>>, want: &BTreeMap<String, Vec<u8>>, what: &str| {
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "{what}: the same files"
        );
        for (k, v) in want {
            assert!(got[k] == *v, "{what}: {k} differs after resuming");
        }
    };
    let mut rng = Rng::new(2026);
    let mut kills = 0;
    for round in 0..5 {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("k3");
        // Ten kills per round: setup and fetch-experts on a streaming install, then the int8
        // conversion on a plain checkpoint.
        for (job, n, span) in [(&setup[..], 4, t_setup), (&fetch[..], 3, t_fetch)] {
            for _ in 0..n {
                kill_at_random(&hub, job, &root, &mut rng, span);
                kills += 1;
                if root.join("config.json").is_file() {
                    doctor_ok(&root);
                }
            }
            finish(&hub, job, &root);
        }
        same(
            files(&root),
            &want,
            &format!("round {round}, streaming install"),
        );
        let proot = d.path().join("plain");
        plain(&proot);
        for _ in 0..3 {
            kill_at_random(&hub, &int8, &proot, &mut rng, t_int8);
            kills += 1;
            doctor_ok(&proot);
        }
        finish(&hub, &int8, &proot);
        same(
            files(&proot),
            &want_plain,
            &format!("round {round}, int8 conversion"),
        );
        let froot = d.path().join("full");
        for _ in 0..3 {
            kill_at_random(&hub, &full, &froot, &mut rng, t_full);
            kills += 1;
            if froot.join("config.json").is_file() {
                doctor_ok(&froot);
            }
        }
        finish(&hub, &full, &froot);
        same(
            files(&froot),
            &want_full,
            &format!("round {round}, full install"),
        );
    }
    assert_eq!(kills, 65);
}
