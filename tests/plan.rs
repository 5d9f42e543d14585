//! `deltafin plan` prints the plan a model is then opened under (from the config and shard
//! headers alone): the same lines, flags and context limit as `run --json` reports after
//! loading, and the same refusal when it does not fit.

#[path = "common/runner.rs"]
mod runner;

use std::process::Command;

fn bin() -> Command {
    runner::command(env!("CARGO_BIN_EXE_deltafin"))
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().expect("a JSON line")).expect("JSON")
}

#[test]
fn plan_is_the_plan_run_loads_under() {
    let d = tempfile::tempdir().unwrap();
    assert!(bin()
        .args(["fixture", "nano"])
        .arg(d.path())
        .status()
        .unwrap()
        .success());
    let flags = ["--memory-gb", "3", "--context", "2048", "--ram-gb", "0.25"];
    let planned = json(
        &bin()
            .args(["plan", "--json", "--model-root"])
            .arg(d.path())
            .args(flags)
            .output()
            .unwrap(),
    );
    let ran = json(
        &bin()
            .args([
                "run",
                "--prompt-ids",
                "1,2,3",
                "--max-new",
                "1",
                "--json",
                "--model-root",
            ])
            .arg(d.path())
            .args(flags)
            .output()
            .unwrap(),
    );
    let loaded = &ran["memory"]["plan"];
    let lines = |p: &serde_json::Value| p["lines"].as_array().expect("lines").clone();
    let (a, b) = (lines(&planned), lines(loaded));
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["what"], y["what"]);
        // The process baseline is measured (resident memory at planning time); every other
        // line is arithmetic on the checkpoint and the flags.
        if x["what"].as_str().unwrap().starts_with("process baseline") {
            continue;
        }
        assert_eq!(x["bytes"], y["bytes"], "{}", x["what"]);
    }
    for field in [
        "context",
        "prefill_pass",
        "expert_ram",
        "prefetch_cap",
        "max_batch",
    ] {
        assert_eq!(planned[field], loaded[field], "{field}");
    }
    // A budget the model does not fit is refused by `plan` as by `run`, naming the flag.
    let out = bin()
        .args(["plan", "--memory-gb", "0.02", "--model-root"])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--memory-gb"), "{err}");
}
