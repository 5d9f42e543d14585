//! The trainer's network against the inference model: an exported checkpoint read back by the
//! trainer gives the logits `K3Model` computes from the same files, at every position.

mod common;

use std::path::Path;

use candle::{Device, Tensor};
use deltafin::checkpoint::tiktoken_fixture::{
    tiktoken_model_text, tokenizer_config_json, train_ranks,
};
use deltafin::models::k3::config::K3Config;
use deltafin::models::k3::fixture::NANO_MERGES;
use deltafin::models::k3::train::{config_json, export::export, Dims, Net};
use deltafin::models::k3::K3Model;

const TEST_DIMS: Dims = Dims {
    hidden: 64,
    layers: 6,
    intermediate: 96,
    experts: 4,
    top_k: 2,
    moe_inter: 64,
    latent: 32,
    heads: 2,
    head_dim: 16,
    block: 2,
};

fn write_tokenizer(dir: &Path) -> u32 {
    let ranks = train_ranks(NANO_MERGES);
    std::fs::write(dir.join("tiktoken.model"), tiktoken_model_text(&ranks)).unwrap();
    let tc = tokenizer_config_json(ranks.len() as u32);
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::to_vec(&tc).unwrap(),
    )
    .unwrap();
    ranks.len() as u32
}

/// A randomly initialised network whose zero-initialised tensors (AttnRes pseudo-queries, router
/// biases) are made random too, so every path of the function is exercised.
fn random_net(cfg: &K3Config, seed: u64) -> Net {
    let mut net = Net::init(cfg, seed, &Device::Cpu).unwrap();
    let mut rng = deltafin::checkpoint::rng::Rng::new(seed);
    let mut randn = |dims: &[usize], std: f64| {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    };
    for (name, v) in &net.vars {
        if name.ends_with("_res_proj.weight") {
            v.set(&randn(v.dims(), 0.5)).unwrap();
        }
    }
    for b in net.biases.values_mut() {
        *b = randn(b.dims(), 0.2);
    }
    net
}

#[test]
fn trainer_logits_equal_the_inference_model_on_exported_weights() {
    let tokdir = tempfile::tempdir().unwrap();
    let first_special = write_tokenizer(tokdir.path());
    let json = config_json(&TEST_DIMS, first_special);
    let cfg = K3Config::from_root(serde_json::from_value(json.clone()).unwrap()).unwrap();
    let seed: u64 = std::env::var("DELTAFIN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let net = random_net(&cfg, seed);
    let out = tempfile::tempdir().unwrap();
    export(&net, &json, tokdir.path(), out.path(), 3).unwrap();

    let back = Net::from_dir(out.path(), &Device::Cpu).unwrap();
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 + 5) % first_special).collect();
    let t = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
    let trainer: Vec<Vec<f32>> = back.forward(&t).unwrap().logits.to_vec2().unwrap();

    let model = K3Model::from_dir(out.path(), &Device::Cpu).unwrap();
    let mut state = model.new_state();
    let inference: Vec<Vec<f32>> = model
        .forward_all(&ids, &mut state)
        .unwrap()
        .to_vec2()
        .unwrap();
    assert_eq!(trainer.len(), inference.len());
    let mut worst = 0f64;
    for (a, b) in trainer.iter().zip(&inference) {
        worst = worst.max(common::rel_err32(a, b));
    }
    eprintln!("trainer vs inference: max rel err {worst:e}");
    // fp32 rounding through six layers (two implementations, different operation orders):
    // 1.8e-5 to 1.8e-4 over nine seeds; one wrong operation gives about 1.
    assert!(worst < 5e-4, "trainer vs inference: max rel err {worst:e}");

    // The export quantised the experts: the trainer's own (unquantised) logits differ.
    let own: Vec<Vec<f32>> = net.forward(&t).unwrap().logits.to_vec2().unwrap();
    let moved = own
        .iter()
        .zip(&inference)
        .map(|(a, b)| common::rel_err32(a, b))
        .fold(0f64, f64::max);
    assert!(moved > worst, "quantisation left the logits unchanged");
}

/// `deltafin-k3 train` checkpoints, resumes where it stopped, and exports a model `run` loads;
/// `compare-fp32` scores the trained fp32 network against the export.
#[test]
fn train_command_resumes_and_exports_a_loadable_model() {
    use common::{deltafin_ok, k3_tools_cmd, k3_tools_ok};
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n).display().to_string();
    let full = include_str!("../data/heldout/persuasion.txt");
    std::fs::write(d.path().join("text.txt"), &full[..20_000]).unwrap();
    let text = &p("text.txt");
    k3_tools_ok(&[
        "train-tokenizer",
        "--text",
        text,
        "--vocab",
        "400",
        "--out",
        &p("tok"),
    ]);
    let (tok, work) = (p("tok"), p("work"));
    let train_args = |steps: &'static str, seed: &'static str, out: String| -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            "--text",
            text,
            "--tokenizer",
            &tok,
            "--work",
            &work,
            "--batch",
            "2",
            "--seq",
            "16",
            "--hidden",
            "32",
            "--warmup",
            "1",
            "--checkpoint-every",
            "1",
            "--heldout",
            text,
            "--steps",
            steps,
            "--seed",
            seed,
            "--out",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(out);
        v
    };
    let train = |steps: &'static str| {
        let a = train_args(steps, "0", p("model"));
        k3_tools_ok(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    };
    train("2");
    let state = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(d.path().join("work/state.json")).unwrap()).unwrap()
    };
    assert_eq!(state()["step"], 2);
    let first = std::fs::read(d.path().join("work/weights.safetensors")).unwrap();
    let out = train("3");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("trained 3 steps"), "{log}");
    assert_eq!(state()["step"], 3, "resumed and ran one more step");
    assert_eq!(
        state()["history"].as_array().unwrap().len(),
        2,
        "two runs recorded"
    );
    assert_ne!(
        first,
        std::fs::read(d.path().join("work/weights.safetensors")).unwrap()
    );
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.path().join("model/TRAINING.json")).unwrap())
            .unwrap();
    assert!(rec["heldout_nll_fp32"].as_f64().unwrap() > 0.0);
    let model = p("model");
    let out = deltafin_ok(&[
        "run",
        "--model-root",
        &model,
        "--prompt",
        "It was",
        "--max-new",
        "4",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["generated_ids"].as_array().unwrap().len(), 4);
    let out = k3_tools_ok(&[
        "compare-fp32",
        "--model-root",
        &model,
        "--work",
        &work,
        "--text",
        text,
        "--window",
        "16",
        "--max-tokens",
        "64",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["report"];
    assert!(r["positions"].as_u64().unwrap() > 0, "{v}");
    let top1 = r["top1_agreement"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&top1), "{v}");
    // The export is the fp32 network quantised: the two score the text alike (a model of a
    // few steps is near uniform, so top-1 agreement says little here).
    let (a, b) = (r["nll_a"].as_f64().unwrap(), r["nll_b"].as_f64().unwrap());
    assert!((a - b).abs() < 0.05 * a, "{v}");
    // A different run (another seed) refuses the checkpoint rather than mixing them.
    let a = train_args("4", "9", p("model2"));
    let err = k3_tools_cmd(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("another --work"));
}
