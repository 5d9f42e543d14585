//! End-to-end tests of the `deltafin` binary on K3-nano.

#[path = "common/runner.rs"]
mod runner;

use std::process::{Command, Stdio};

fn bin() -> Command {
    runner::command(env!("CARGO_BIN_EXE_deltafin"))
}

/// `deltafin run ARGS --model-root DIR`.
fn run_on(d: &std::path::Path, args: &[&str]) -> std::process::Output {
    bin()
        .arg("run")
        .args(args)
        .arg("--model-root")
        .arg(d)
        .output()
        .unwrap()
}

/// `deltafin ARGS DIR`, which must succeed.
fn succeed(args: &[&str], dir: &std::path::Path) {
    let st = bin().args(args).arg(dir).status().unwrap();
    assert!(st.success(), "deltafin {args:?} failed");
}

fn nano() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    succeed(&["fixture", "nano"], d.path());
    d
}

#[test]
fn run_json_and_chat() {
    let d = nano();
    let out = bin()
        .args([
            "run",
            "--prompt-ids",
            "12,7,99",
            "--max-new",
            "5",
            "--json",
            "--model-root",
        ])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["prompt_ids"], serde_json::json!([12, 7, 99]));
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 5);
    let top = v["first_step_top"].as_array().unwrap();
    assert_eq!(top.len(), 10);
    assert_eq!(top[0][0], v["generated_ids"][0]);
    assert!(top.windows(2).all(|w| w[0][1].as_f64() >= w[1][1].as_f64()));

    let out = bin()
        .args([
            "run",
            "--chat",
            "--prompt",
            "Hello there",
            "--max-new",
            "4",
            "--model-root",
        ])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[4 tokens"), "{err}");
    assert!(
        err.contains("spine: bf16 from the checkpoint shards"),
        "{err}"
    );

    // Bad input is an error with a message, not a panic.
    let out = bin()
        .args(["run", "--prompt-ids", "999999", "--model-root"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
    let out = bin()
        .args(["run", "--prompt-ids", "1", "--model-root", "/nonexistent"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("config.json"));
}

#[test]
fn int8_conversion_is_picked_up() {
    let d = nano();
    let st = bin()
        .args(["convert-spine-int8", "--model-root"])
        .arg(d.path())
        .status()
        .unwrap();
    assert!(st.success());
    let out = bin()
        .args(["run", "--prompt-ids", "5", "--max-new", "2", "--model-root"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("spine: int8 from the converted store"));
    let out = bin()
        .args([
            "run",
            "--prompt-ids",
            "5",
            "--max-new",
            "2",
            "--spine",
            "bf16",
            "--model-root",
        ])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("spine: bf16"));
}

#[test]
fn ctrl_c_stops_cleanly() {
    let d = nano();
    let child = bin()
        .args([
            "run",
            "--prompt-ids",
            "1,2,3",
            "--max-new",
            "1000000",
            // The run must still be generating when the signal comes, whatever the weights do.
            "--ignore-eos",
            "--model-root",
        ])
        .arg(d.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // SAFETY: sending SIGINT to our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "exit {:?}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stop: Cancelled"), "{err}");
    let ids = String::from_utf8_lossy(&out.stdout);
    assert!(
        ids.trim().split(',').count() > 1,
        "the ids generated so far are printed"
    );
}

/// The chat example, driven through a pipe for two turns (it is built with the tests).
#[test]
fn chat_example_two_turns() {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join("chat");
    if !example.is_file() {
        panic!("chat example not built at {}", example.display());
    }
    let d = nano();
    let mut child = runner::command(example)
        .arg(d.path())
        .env("DELTAFIN_MAX_NEW", "3")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"Hello\nWhat is 2+2?\n").unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("[3 tokens").count(), 2, "{err}");
    // The session keeps the first turn: the second feeds only the new turn, so it is shorter
    // (the first also carries the system preamble).
    let lens: Vec<usize> = err
        .lines()
        .filter_map(|l| l.split("prefill ").nth(1))
        .filter_map(|l| l.split(" for ").nth(1))
        .filter_map(|l| l.split(' ').next())
        .filter_map(|n| n.parse().ok())
        .collect();
    assert_eq!(lens.len(), 2);
    assert!(lens[1] < lens[0], "{lens:?}\n{err}");
}

/// `--device cpu` runs and reports the device; `--device metal` in a CPU build stops with an
/// error naming the fix (in a Metal build it must run).
#[test]
fn device_flag() {
    let d = nano();
    let run = |dev: &str| {
        bin()
            .args([
                "run",
                "--prompt-ids",
                "12,7",
                "--max-new",
                "2",
                "--device",
                dev,
            ])
            .arg("--model-root")
            .arg(d.path())
            .output()
            .unwrap()
    };
    let out = run("cpu");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("device: cpu"), "{err}");
    let out = run("metal");
    let err = String::from_utf8_lossy(&out.stderr);
    if deltafin::compute::device::METAL_COMPILED && candle::Device::new_metal(0).is_ok() {
        assert!(out.status.success(), "{err}");
    } else if deltafin::compute::device::METAL_COMPILED {
        assert!(err.contains("no Metal device"), "{err}");
    } else {
        assert!(!out.status.success());
        assert!(err.contains("--features metal"), "{err}");
    }
}

/// `--layer-profile` prints one timing line per layer per forward pass.
#[test]
fn layer_profile_lines() {
    let d = nano();
    let out = run_on(
        d.path(),
        &[
            "--prompt-ids",
            "12,7,99",
            "--max-new",
            "3",
            "--layer-profile",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("[layer")).collect();
    // K3-nano has 10 layers; 3 tokens take the prefill pass and 2 decode passes.
    assert_eq!(lines.len(), 30, "{err}");
    assert!(
        lines[0].contains("T=3") && lines[10].contains("T=1"),
        "{err}"
    );
    assert!(lines
        .iter()
        .all(|l| l.contains("spine-wait") && l.contains("expert wait")));
    assert_eq!(
        lines.iter().filter(|l| l.contains(" mla ")).count(),
        9,
        "{err}"
    );
}

/// `bench dense` reports both formats against a memory bandwidth measured in the same run.
#[test]
fn bench_dense_reports_ratios() {
    let out = bin()
        .args(["bench", "dense", "--gb", "0.05", "--runs", "1"])
        .args(["--threads", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for format in ["int8", "bf16"] {
        let g = lines
            .iter()
            .find(|v| v["figure"] == "dense_gemv_gbps" && v["format"] == format)
            .unwrap();
        assert!(g["median"].as_f64().unwrap() > 0.0);
        assert!(g["ratio_to_memory_read"].as_f64().unwrap() > 0.0);
    }
}

/// `--events-jsonl`: a start event, one event per generated token (the same ids `--json`
/// reports) and an end event, each a JSON object with a time stamp.
#[test]
fn events_jsonl_stream() {
    let d = nano();
    let ev = d.path().join("events.jsonl");
    let out = run_on(
        d.path(),
        &[
            "--prompt-ids",
            "12,7,99",
            "--max-new",
            "4",
            "--json",
            "--events-jsonl",
            ev.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let events: Vec<serde_json::Value> = std::fs::read_to_string(&ev)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.first().unwrap()["event"], "start");
    assert_eq!(events.first().unwrap()["prompt_tokens"], 3);
    let ids: Vec<serde_json::Value> = events
        .iter()
        .filter(|e| e["event"] == "token")
        .map(|e| e["id"].clone())
        .collect();
    assert_eq!(serde_json::Value::Array(ids), v["generated_ids"]);
    let end = events.last().unwrap();
    assert_eq!(end["event"], "end");
    assert_eq!(end["generated"], 4);
    assert!(events.iter().all(|e| e["t_ms"].as_f64().is_some()));
}

/// `doctor`: a good model passes; a truncated shard and a half-converted spine are reported with
/// the fix, and a failure makes the exit status non-zero.
#[test]
fn doctor_reports_problems() {
    let d = nano();
    let doctor = || {
        bin()
            .args(["doctor", "--verify", "--model-root"])
            .arg(d.path())
            .output()
            .unwrap()
    };
    let out = doctor();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("0 failure(s)") && text.contains("ok    experts"),
        "{text}"
    );
    assert!(text.contains("ok    kda gate"), "{text}");
    // A partial int8 conversion: one layer file removed.
    succeed(&["convert-spine-int8", "--model-root"], d.path());
    let store = d.path().join("deltafin-spine/int8");
    std::fs::remove_file(store.join("layer-004.bin")).unwrap();
    let text = String::from_utf8_lossy(&doctor().stdout).to_string();
    assert!(
        text.contains("warn  spine int8") && text.contains("convert-spine-int8"),
        "{text}"
    );
    // A flipped byte in the converted BF16 store's embedding (same size, header intact) is
    // caught by --verify, which reads the tail and embedding files too.
    succeed(&["convert-spine", "--model-root"], d.path());
    let embed = d.path().join("deltafin-spine/bf16/embed.bin");
    let mut b = std::fs::read(&embed).unwrap();
    let at = b.len() - 10;
    b[at] ^= 0x5a;
    std::fs::write(&embed, &b).unwrap();
    let text = String::from_utf8_lossy(&doctor().stdout).to_string();
    assert!(
        text.contains("FAIL  spine bf16") && text.contains("embed.bin"),
        "{text}"
    );
    std::fs::remove_dir_all(d.path().join("deltafin-spine/bf16")).unwrap();
    // A temporary left by a crashed writer is reported.
    std::fs::write(d.path().join(".config.json.999999.0.tmp"), b"x").unwrap();
    let text = String::from_utf8_lossy(&doctor().stdout).to_string();
    assert!(text.contains("warn  temporaries: 1 left"), "{text}");
    // Non-zero A_log padding (past the per-head values) in layer 1 is reported, naming it.
    let inv = deltafin::checkpoint::Inventory::from_dir(d.path()).unwrap();
    let info = inv.get(&inv.layer_name(1, "self_attn.A_log")).unwrap();
    let cfg =
        deltafin::models::k3::config::K3Config::from_file(&d.path().join("config.json")).unwrap();
    let heads = cfg.text().linear_attn_config.num_heads as u64;
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(inv.shard_path(info.shard))
            .unwrap(),
        &0.5f32.to_le_bytes(),
        info.start + 4 * heads,
    )
    .unwrap();
    let text = String::from_utf8_lossy(&doctor().stdout).to_string();
    assert!(
        text.contains("warn  kda gate") && text.contains("layer 1"),
        "{text}"
    );
    // A truncated shard.
    let shard = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .unwrap();
    let len = std::fs::metadata(&shard).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let out = doctor();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("FAIL  shards"), "{text}");
}

/// One writer per model root: while this process holds the root's lock, `convert-spine` in
/// another process is refused at once with a message naming this process; afterwards it runs.
#[test]
fn a_second_writer_is_refused_naming_the_holder() {
    let d = nano();
    let lock = deltafin::fsio::RootLock::acquire(d.path()).unwrap();
    let out = bin()
        .args(["convert-spine", "--model-root"])
        .arg(d.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("another deltafin process")
            && err.contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    assert!(!d.path().join("deltafin-spine/bf16/layer-000.bin").exists());
    drop(lock);
    succeed(&["convert-spine", "--model-root"], d.path());
    assert!(d.path().join("deltafin-spine/bf16/layer-000.bin").is_file());
}

/// `bench forward` opens any family through the registry: on gpt-oss and Qwen3-MoE fixtures it
/// times prefill and decode, and `--speculate` runs (and fails if speculation changed a reply).
#[test]
fn bench_forward_runs_on_every_family() {
    let d = tempfile::tempdir().unwrap();
    for name in ["gpt-oss-tiny", "qwen3-moe", "nano"] {
        let root = d.path().join(name);
        let out = bin().args(["fixture", name]).arg(&root).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bench = |extra: &[&str]| -> Vec<serde_json::Value> {
            let out = bin()
                .args(["bench", "forward", "--model-root"])
                .arg(&root)
                .args(["--prompt-len", "8", "--decode", "4", "--runs", "1"])
                .args(extra)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{name} {extra:?}: {err}");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with('{'))
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        let plain = bench(&[]);
        for figure in ["prefill_ms_per_token", "decode_ms_per_token"] {
            let f = plain.iter().find(|v| v["figure"] == figure).unwrap();
            assert!(f["median"].as_f64().unwrap() > 0.0, "{name}: {f}");
        }
        let spec = bench(&["--speculate"]);
        let summaries = spec
            .iter()
            .filter(|v| v["figure"] == "spec_summary")
            .count();
        assert_eq!(summaries, 2, "{name}: {spec:?}");
    }
}
