//! Streams the routed experts of a MoE model this crate has no family for, through the public
//! API alone: a Mixtral-style block (each expert three BF16 matrices `w1` gate, `w3` up, `w2`
//! down under the model's own tensor names; a softmax router whose top 2 are renormalised;
//! SiLU). The example writes such a checkpoint, describes the expert as a value (`ExpertFfn`),
//! finds every expert's bytes in the file with the model's naming function
//! (`ExpertIndex::derive`), serves them from `TieredExperts` with a RAM tier a quarter of the
//! experts' size, and runs `RoutedExperts` over a few decode steps. Each layer's output is
//! checked against plain Candle arithmetic on the same weights, and the store's counters show
//! which experts came from the file and which from RAM.
//!
//! `cargo run --release --example stream_moe [-- DIR]` (DIR: where to write the checkpoint; a
//! temporary directory by default).

use std::collections::HashMap;
use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use candle::{Device, Tensor};
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{TieredExperts, TieredOptions};
use deltafin::moe::{
    Activation, ExecOptions, ExpertFfn, Gating, GluLayout, Matrix, Part, PartKind, Route,
    RoutedExperts, WeightFormat,
};

const LAYERS: usize = 4;
const EXPERTS: usize = 16;
const TOP_K: usize = 2;
const WIDTH: usize = 256;
const INTER: usize = 512;
const STEPS: usize = 8;

/// The model's own tensor names: `w1` gate, `w3` up, `w2` down (in `ExpertFfn::parts` order).
fn tensor_name(layer: usize, expert: usize, part: usize) -> String {
    let w = ["w1", "w3", "w2"][part];
    format!("model.layers.{layer}.block_sparse_moe.experts.{expert}.{w}.weight")
}

/// Deterministic values in [-scale, scale) (xorshift), so every run streams the same model.
fn values(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
        })
        .collect()
}

/// Writes the experts as BF16 into `dir/model.safetensors`; returns them as f32 Candle
/// tensors (rounded through BF16, as stored) for the reference.
fn write_checkpoint(dir: &Path) -> Result<HashMap<String, Tensor>, Box<dyn Error>> {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes = Vec::new();
    let mut weights = HashMap::new();
    for l in 0..LAYERS {
        for e in 0..EXPERTS {
            for (p, (rows, cols)) in [(INTER, WIDTH), (INTER, WIDTH), (WIDTH, INTER)]
                .into_iter()
                .enumerate()
            {
                let v: Vec<half::bf16> = values(&mut seed, rows * cols, 0.08)
                    .into_iter()
                    .map(half::bf16::from_f32)
                    .collect();
                let f: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
                weights.insert(
                    tensor_name(l, e, p),
                    Tensor::from_vec(f, (rows, cols), &Device::Cpu)?,
                );
                let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                bytes.push((tensor_name(l, e, p), vec![rows, cols], raw));
            }
        }
    }
    let views = bytes
        .iter()
        .map(|(n, shape, b)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, shape.clone(), b);
            view.map(|v| (n.clone(), v))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors"))?;
    Ok(weights)
}

/// The same block in plain Candle: per token, its selected experts' SwiGLU, weighted.
fn reference(
    x: &Tensor,
    routes: &[Route],
    layer: usize,
    w: &HashMap<String, Tensor>,
) -> candle::Result<Tensor> {
    let mut rows = Vec::new();
    for (t, route) in routes.iter().enumerate() {
        let xt = x.narrow(0, t, 1)?;
        let mut acc = Tensor::zeros((1, WIDTH), candle::DType::F32, &Device::Cpu)?;
        for (&e, &weight) in route.experts.iter().zip(&route.weights) {
            let m = |p| &w[&tensor_name(layer, e, p)];
            let gate = xt.matmul(&m(0).t()?)?;
            let up = xt.matmul(&m(1).t()?)?;
            let y = (candle_nn::ops::silu(&gate)? * up)?.matmul(&m(2).t()?)?;
            acc = (acc + (y * weight as f64)?)?;
        }
        rows.push(acc);
    }
    Tensor::cat(&rows, 0)
}

fn main() -> Result<(), Box<dyn Error>> {
    let tmp = tempfile::tempdir()?;
    let dir = std::env::args()
        .nth(1)
        .map(Into::into)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&dir)?;
    let weights = write_checkpoint(&dir)?;

    // The expert as a value: its format, widths, activation, and the order of its parts.
    let part = |matrix| Part {
        matrix,
        kind: PartKind::Weight,
    };
    let ffn = ExpertFfn {
        format: WeightFormat::Bf16,
        width: WIDTH,
        inter: INTER,
        glu: GluLayout::Separate,
        activation: Activation::Silu,
        parts: vec![part(Matrix::Gate), part(Matrix::Up), part(Matrix::Down)],
    };
    // Where each expert's parts lie in the shards, from the headers alone.
    let inv = Arc::new(Inventory::from_dir(&dir)?);
    let moe_layers: Vec<usize> = (0..LAYERS).collect();
    let index = ExpertIndex::derive(
        &inv,
        LAYERS,
        &moe_layers,
        EXPERTS,
        ffn.layout(),
        tensor_name,
    )?;
    let expert_bytes = index.layout.span_bytes();
    let all = (LAYERS * EXPERTS) as u64 * expert_bytes;
    // A RAM tier a quarter of the experts: the rest is read from the file when routed.
    let opts = TieredOptions {
        ram_budget: (all / 4) as usize,
        ..Default::default()
    };
    let store = TieredExperts::new(Arc::new(index), Some(inv), None, &opts)?;
    let block = RoutedExperts { ffn, top_k: TOP_K };
    let gating = Gating::Softmax { renormalize: true };

    let mut seed = 7u64;
    let routers: Vec<Tensor> = (0..LAYERS)
        .map(|_| {
            Tensor::from_vec(
                values(&mut seed, EXPERTS * WIDTH, 0.5),
                (EXPERTS, WIDTH),
                &Device::Cpu,
            )
        })
        .collect::<candle::Result<_>>()?;
    let mut worst = 0f32;
    for step in 0..STEPS {
        // One decode step's hidden state through every MoE layer, with a residual.
        let mut x = Tensor::from_vec(values(&mut seed, WIDTH, 1.0), (1, WIDTH), &Device::Cpu)?;
        let mut picked = Vec::new();
        for (l, router) in routers.iter().enumerate() {
            let logits = x.matmul(&router.t()?)?.to_vec2::<f32>()?;
            let routes: Vec<Route> = logits.iter().map(|r| gating.route(r, &[], TOP_K)).collect();
            let y = block.forward(l, &x, &routes, &store, &ExecOptions::default())?;
            let want = reference(&x, &routes, l, &weights)?;
            let diff = (&y - &want)?.abs()?.max_all()?.to_scalar::<f32>()?;
            let scale = want.abs()?.max_all()?.to_scalar::<f32>()?.max(1e-6);
            worst = worst.max(diff / scale);
            picked.push(format!("{:?}", routes[0].experts));
            x = (x + y)?;
        }
        println!("step {step}: experts per layer {}", picked.join(" "));
    }
    let s = store.stats();
    println!(
        "{} experts of {:.2} MB in {LAYERS} layers ({:.1} MB), RAM tier {:.1} MB",
        LAYERS * EXPERTS,
        expert_bytes as f64 / 1e6,
        all as f64 / 1e6,
        opts.ram_budget as f64 / 1e6
    );
    println!(
        "read from the file: {} experts ({:.1} MB); served from RAM: {}; prefetch hits: {}",
        s.shard_experts,
        s.shard_bytes as f64 / 1e6,
        s.ram_experts,
        s.prefetch_hits
    );
    println!("largest difference from plain Candle: {worst:.2e} of the output's scale");
    if worst > 1e-4 {
        return Err(format!("the streamed block differs from the reference by {worst:.2e}").into());
    }
    Ok(())
}
