//! The MoE runtime reused for models that are not K3, through the public API only: a
//! gpt-oss-shaped block (each layer's experts stacked as MXFP4 `_blocks`/`_scales` with BF16
//! biases, interleaved gate/up, a softmax-over-top-k router, SwiGLU-OAI with α = 1.702 and
//! clamp 7) and a Qwen3-MoE-shaped block (BF16 per-expert tensors, softmax router with
//! renormalised top-k, SiLU), their experts streamed through `TieredExperts` from a safetensors
//! file this test writes, each checked against a dequantised Candle reference written here.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use candle::{DType, Device, IndexOp, Tensor, D};
use deltafin::checkpoint::{ExpertIndex, Inventory};
use deltafin::experts::{TieredExperts, TieredOptions};
use deltafin::kernels::dense::DenseKernel;
use deltafin::moe::{
    Activation, ExecOptions, ExpertFfn, Gating, GluLayout, Matrix, Part, PartKind, Route,
    RoutedExperts, WeightFormat,
};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// E8M0 scales between 2^-6 and 2^0.
    fn scales(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| 121 + (self.next() % 7) as u8).collect()
    }
    fn normal(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.next() >> 11) as f32 / (1u64 << 53) as f32 - 0.5) * 2.0 * scale)
            .collect()
    }
}

fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Writes `model.safetensors` with the given tensors.
fn write(dir: &Path, tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// The reference's own MXFP4 decode: E2M1 codes low nibble first, one E8M0 scale
/// (`2^(s-127)`) per 32 values along a row. `[rows, cols]` f32.
fn dequant(blocks: &[u8], scales: &[u8], rows: usize, cols: usize) -> Tensor {
    let lut = [
        0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];
    let mut out = Vec::with_capacity(rows * cols);
    for r in 0..rows {
        for c in 0..cols {
            let b = blocks[r * cols / 2 + c / 2];
            let code = if c % 2 == 0 { b & 15 } else { b >> 4 };
            let s = scales[r * cols / 32 + c / 32] as i32 - 127;
            out.push(lut[code as usize] * 2f32.powi(s));
        }
    }
    Tensor::from_vec(out, (rows, cols), &Device::Cpu).unwrap()
}

fn bf16_tensor(b: &[u8], shape: &[usize]) -> Tensor {
    let v: Vec<f32> = b
        .chunks_exact(2)
        .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// `x W^T (+ b)` for `x` `[T, in]`.
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Tensor {
    let y = x.matmul(&w.t().unwrap()).unwrap();
    match b {
        Some(b) => y.broadcast_add(b).unwrap(),
        None => y,
    }
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> f32 {
    let d = (a - b).unwrap().abs().unwrap().max_all().unwrap();
    let m = b.abs().unwrap().max_all().unwrap();
    d.to_scalar::<f32>().unwrap() / m.to_scalar::<f32>().unwrap().max(1e-6)
}

const E: usize = 8;
const WIDTH: usize = 64;
const INTER: usize = 96;
const K: usize = 3;
const LAYERS: usize = 2;
const T: usize = 24;

fn store(dir: &Path, index: ExpertIndex) -> TieredExperts {
    let inv = Arc::new(Inventory::from_dir(dir).unwrap());
    let opts = TieredOptions {
        ram_budget: 0,
        prefetch_previous: false,
        ..Default::default()
    };
    TieredExperts::new(Arc::new(index), Some(inv), None, &opts).unwrap()
}

/// gpt-oss's layout: per layer, `gate_up_proj_{blocks,scales,bias}` and
/// `down_proj_{blocks,scales,bias}`, experts stacked on dim 0, packed codes `[.., rows,
/// cols/32, 16]`; gate and up rows interleaved.
#[test]
fn gpt_oss_shaped_block_streams_and_matches_a_dequantised_reference() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let name = |l: usize, s: &str| format!("model.layers.{l}.mlp.experts.{s}");
    let mut tensors = Vec::new();
    let mut raw: HashMap<String, Vec<u8>> = HashMap::new();
    for l in 0..LAYERS {
        let parts = [
            (
                "gate_up_proj_blocks",
                Dtype::U8,
                vec![E, 2 * INTER, WIDTH / 32, 16],
            ),
            (
                "gate_up_proj_scales",
                Dtype::U8,
                vec![E, 2 * INTER, WIDTH / 32],
            ),
            ("gate_up_proj_bias", Dtype::BF16, vec![E, 2 * INTER]),
            (
                "down_proj_blocks",
                Dtype::U8,
                vec![E, WIDTH, INTER / 32, 16],
            ),
            ("down_proj_scales", Dtype::U8, vec![E, WIDTH, INTER / 32]),
            ("down_proj_bias", Dtype::BF16, vec![E, WIDTH]),
        ];
        for (s, d, shape) in parts {
            let n: usize = shape.iter().product();
            let b = match (d, s.ends_with("scales")) {
                (Dtype::BF16, _) => bf16_bytes(&rng.normal(n, 0.5)),
                (_, true) => rng.scales(n),
                _ => rng.bytes(n),
            };
            raw.insert(name(l, s), b.clone());
            tensors.push((name(l, s), d, shape, b));
        }
    }
    write(dir.path(), &tensors);

    // The runtime: the expert described as a value, stacked spans, the tiered store.
    let part = |matrix, kind| Part { matrix, kind };
    let ffn = ExpertFfn {
        format: WeightFormat::Mxfp4,
        width: WIDTH,
        inter: INTER,
        glu: GluLayout::Interleaved,
        activation: Activation::SwiGluOai {
            alpha: 1.702,
            limit: 7.0,
        },
        parts: vec![
            part(Matrix::GateUp, PartKind::Packed),
            part(Matrix::GateUp, PartKind::Scales),
            part(Matrix::GateUp, PartKind::Bias),
            part(Matrix::Down, PartKind::Packed),
            part(Matrix::Down, PartKind::Scales),
            part(Matrix::Down, PartKind::Bias),
        ],
    };
    let suffix = [
        "gate_up_proj_blocks",
        "gate_up_proj_scales",
        "gate_up_proj_bias",
    ];
    let suffix = [
        &suffix[..],
        &["down_proj_blocks", "down_proj_scales", "down_proj_bias"],
    ]
    .concat();
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let index = ExpertIndex::derive_stacked(&inv, LAYERS, &[0, 1], E, ffn.layout(), |l, p| {
        name(l, suffix[p])
    })
    .unwrap();
    let experts = store(dir.path(), index);
    let block = RoutedExperts { ffn, top_k: K };
    let router_w = Tensor::from_vec(rng.normal(E * WIDTH, 0.3), (E, WIDTH), &Device::Cpu).unwrap();
    let router_b = Tensor::from_vec(rng.normal(E, 0.1), E, &Device::Cpu).unwrap();
    let x = Tensor::from_vec(rng.normal(T * WIDTH, 1.0), (T, WIDTH), &Device::Cpu).unwrap();

    for l in 0..LAYERS {
        let logits = linear(&x, &router_w, Some(&router_b))
            .to_vec2::<f32>()
            .unwrap();
        let routes: Vec<Route> = logits
            .iter()
            .map(|r| Gating::TopKSoftmax.route(r, &[], K))
            .collect();
        let got = block
            .forward(l, &x, &routes, &experts, &ExecOptions::default())
            .unwrap();

        // The reference: every expert dequantised to a Candle tensor, the math in Candle ops.
        let b = |s: &str| &raw[&name(l, s)];
        let (gu_rows, gu_bytes, gu_sc) = (2 * INTER, 2 * INTER * WIDTH / 2, 2 * INTER * WIDTH / 32);
        let (d_bytes, d_sc) = (WIDTH * INTER / 2, WIDTH * INTER / 32);
        let mut want = Vec::new();
        for (t, rt) in routes.iter().enumerate() {
            // Independent routing: top-k of the logits, softmax over them.
            let row = &logits[t];
            let mut idx: Vec<usize> = (0..E).collect();
            idx.sort_by(|&a, &c| row[c].total_cmp(&row[a]));
            assert_eq!(&idx[..K], &rt.experts[..], "row {t}: the selection");
            let sel = Tensor::new(
                idx[..K].iter().map(|&i| row[i]).collect::<Vec<_>>(),
                &Device::Cpu,
            )
            .unwrap();
            let w = candle_nn::ops::softmax(&sel, 0)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            let xt = x.i(t..t + 1).unwrap();
            let mut acc = Tensor::zeros((1, WIDTH), DType::F32, &Device::Cpu).unwrap();
            for (s, &e) in idx[..K].iter().enumerate() {
                // Expert `e`'s slice of a stacked tensor of `n`-byte items.
                let part = |s: &str, n: usize| &b(s)[e * n..(e + 1) * n];
                let gu = dequant(
                    part("gate_up_proj_blocks", gu_bytes),
                    part("gate_up_proj_scales", gu_sc),
                    gu_rows,
                    WIDTH,
                );
                let gu_b = bf16_tensor(part("gate_up_proj_bias", 2 * gu_rows), &[gu_rows]);
                let dw = dequant(
                    part("down_proj_blocks", d_bytes),
                    part("down_proj_scales", d_sc),
                    WIDTH,
                    INTER,
                );
                let d_b = bf16_tensor(part("down_proj_bias", 2 * WIDTH), &[WIDTH]);
                let h = linear(&xt, &gu, Some(&gu_b))
                    .reshape((1, INTER, 2))
                    .unwrap();
                let g = h.i((.., .., 0)).unwrap().clamp(f32::MIN, 7.0).unwrap();
                let u = h.i((.., .., 1)).unwrap().clamp(-7.0, 7.0).unwrap();
                let glu = (&g * candle_nn::ops::sigmoid(&(&g * 1.702).unwrap()).unwrap()).unwrap();
                let a = (glu * (u + 1.0).unwrap()).unwrap();
                let y = linear(&a, &dw, Some(&d_b));
                acc = (acc + (y * w[s] as f64).unwrap()).unwrap();
            }
            want.push(acc);
        }
        let want = Tensor::cat(&want, 0).unwrap();
        let rel = max_rel_diff(&got, &want);
        assert!(rel < 1e-4, "layer {l}: max relative difference {rel}");
    }
    // Every expert read once per layer at most, all from the shards (no RAM tier here).
    let st = experts.stats();
    assert!(st.shard_experts > 0, "{st:?}");
    assert!(st.shard_experts <= (LAYERS * E) as u64, "{st:?}");
}

/// Qwen3-MoE's layout: BF16 per-expert `gate_proj`/`up_proj`/`down_proj`, softmax router with
/// the top-k renormalised, SiLU; exact and with `ExecOptions::dense` fused.
#[test]
fn qwen3_moe_shaped_block_streams_and_matches_a_candle_reference() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let name = |l: usize, e: usize, s: &str| format!("model.layers.{l}.mlp.experts.{e}.{s}.weight");
    let mats = [
        ("gate_proj", INTER, WIDTH),
        ("up_proj", INTER, WIDTH),
        ("down_proj", WIDTH, INTER),
    ];
    let mut tensors = Vec::new();
    let mut raw: HashMap<String, Tensor> = HashMap::new();
    for l in 0..LAYERS {
        for e in 0..E {
            for (s, r, c) in mats {
                let b = bf16_bytes(&rng.normal(r * c, 0.2));
                raw.insert(name(l, e, s), bf16_tensor(&b, &[r, c]));
                tensors.push((name(l, e, s), Dtype::BF16, vec![r, c], b));
            }
        }
    }
    write(dir.path(), &tensors);

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
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let index = ExpertIndex::derive(&inv, LAYERS, &[0, 1], E, ffn.layout(), |l, e, p| {
        name(l, e, mats[p].0)
    })
    .unwrap();
    let experts = store(dir.path(), index);
    let block = RoutedExperts { ffn, top_k: K };
    let router = Tensor::from_vec(rng.normal(E * WIDTH, 0.3), (E, WIDTH), &Device::Cpu).unwrap();
    let x = Tensor::from_vec(rng.normal(T * WIDTH, 1.0), (T, WIDTH), &Device::Cpu).unwrap();
    let gating = Gating::Softmax { renormalize: true };
    let fused = ExecOptions {
        dense: DenseKernel::Fast,
        ..Default::default()
    };
    let mut differ = false;

    for l in 0..LAYERS {
        let logits = linear(&x, &router, None);
        let routes: Vec<Route> = logits
            .to_vec2::<f32>()
            .unwrap()
            .iter()
            .map(|r| gating.route(r, &[], K))
            .collect();
        let got = block
            .forward(l, &x, &routes, &experts, &ExecOptions::default())
            .unwrap();

        let probs = candle_nn::ops::softmax(&logits, D::Minus1)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let mut want = Vec::new();
        for (t, p) in probs.iter().enumerate() {
            let mut idx: Vec<usize> = (0..E).collect();
            idx.sort_by(|&a, &c| p[c].total_cmp(&p[a]));
            assert_eq!(&idx[..K], &routes[t].experts[..], "row {t}: the selection");
            let sum: f32 = idx[..K].iter().map(|&i| p[i]).sum();
            let xt = x.i(t..t + 1).unwrap();
            let mut acc = Tensor::zeros((1, WIDTH), DType::F32, &Device::Cpu).unwrap();
            for &e in &idx[..K] {
                let g = linear(&xt, &raw[&name(l, e, "gate_proj")], None);
                let u = linear(&xt, &raw[&name(l, e, "up_proj")], None);
                let a = (candle_nn::ops::silu(&g).unwrap() * u).unwrap();
                let y = linear(&a, &raw[&name(l, e, "down_proj")], None);
                acc = (acc + (y * (p[e] / sum) as f64).unwrap()).unwrap();
            }
            want.push(acc);
        }
        let want = Tensor::cat(&want, 0).unwrap();
        let rel = max_rel_diff(&got, &want);
        assert!(rel < 1e-4, "layer {l}: max relative difference {rel}");
        // The BF16 experts in `ExecOptions::dense`'s arithmetic: as close to the reference,
        // and other bits where the CPU has the fused kernel.
        let fast = block.forward(l, &x, &routes, &experts, &fused).unwrap();
        let rel = max_rel_diff(&fast, &want);
        assert!(
            rel < 1e-4,
            "layer {l}, fused: max relative difference {rel}"
        );
        let (g, f) = (
            got.to_vec2::<f32>().unwrap(),
            fast.to_vec2::<f32>().unwrap(),
        );
        differ |= g != f;
    }
    assert_eq!(differ, DenseKernel::Fast.effective() == DenseKernel::Fast);
}

/// A stacked part whose shape disagrees with the description is named in the error.
#[test]
fn a_stacked_part_of_the_wrong_shape_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let n = "layers.0.experts.down_proj.weight".to_string();
    write(
        dir.path(),
        &[(
            n.clone(),
            Dtype::BF16,
            vec![E, WIDTH, INTER + 1],
            vec![0; E * WIDTH * (INTER + 1) * 2],
        )],
    );
    let ffn = ExpertFfn {
        format: WeightFormat::Bf16,
        width: WIDTH,
        inter: INTER,
        glu: GluLayout::Separate,
        activation: Activation::Silu,
        parts: vec![Part {
            matrix: Matrix::Down,
            kind: PartKind::Weight,
        }],
    };
    let inv = Inventory::from_dir(dir.path()).unwrap();
    let e = ExpertIndex::derive_stacked(&inv, 1, &[0], E, ffn.layout(), |_, _| n.clone())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&n) && e.contains(&format!("[{E}, {WIDTH}, {INTER}]")),
        "{e}"
    );
}
