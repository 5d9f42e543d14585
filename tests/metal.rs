//! The Metal path against the CPU path (`--features metal`, on a Mac; the macOS workflow runs
//! these). Each test opens Metal device 0 and says so when there is none.
#![cfg(feature = "metal")]

mod common;

use std::sync::Arc;

use candle::{Device, Tensor};
use common::{nano, rel_err32};
use deltafin::checkpoint::rng::Rng;
use deltafin::checkpoint::Dtype;
use deltafin::compute::{dense, spine_device};
use deltafin::experts::{ExpertBytes, TieredOptions};
use deltafin::fsio::{BufPool, PooledBuf};
use deltafin::kernels::dense::quantize_row_int8;
use deltafin::models::k3::K3Model;
use deltafin::moe::device::run_experts;
use deltafin::mxfp4::{matvec, Kernel, Mxfp4Expert, Mxfp4Weights};
use deltafin::spine::layer::LayerData;
use deltafin::spine::source::SpineOptions;

fn metal() -> Option<Device> {
    match Device::new_metal(0) {
        Ok(d) => Some(d),
        // Where a GPU is required (the macOS workflow), its absence is a failure, not a skip.
        Err(e) if std::env::var_os("DELTAFIN_REQUIRE_METAL").is_some_and(|v| v == "1") => {
            panic!("DELTAFIN_REQUIRE_METAL=1 but no Metal device opens: {e}")
        }
        Err(e) => {
            eprintln!("no Metal device ({e}); the Metal tests cannot run on this machine");
            None
        }
    }
}

fn close(got: &[f32], want: &[f32], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let e = rel_err32(got, want);
    assert!(e <= tol, "{what}: relative error {e:e} > {tol:e}");
}

/// BF16, F32 and row-int8 spine matrices through a template layer equal the CPU kernel.
#[test]
fn metal_dense_gemv_matches_cpu() {
    let Some(dev) = metal() else { return };
    let mut rng = Rng::new(3);
    let (rows, cols, t) = (96usize, 200usize, 3usize);
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.normal() as f32 * 0.05)
        .collect();
    let bf: Vec<u8> = w
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let f: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (mut q, mut sc) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let (qq, s) = quantize_row_int8(&w[r * cols..(r + 1) * cols]);
        q.extend(qq.iter().map(|v| *v as u8));
        sc.extend(s.to_le_bytes());
    }
    let mut layer = LayerData::pack(vec![
        ("a.weight".into(), Dtype::BF16, vec![rows, cols], bf),
        ("b.weight".into(), Dtype::F32, vec![rows, cols], f),
        ("c.weight".into(), Dtype::I8, vec![rows, cols], q),
        ("c.weight.row_scale".into(), Dtype::F16, vec![rows], sc),
    ]);
    let xs: Vec<f32> = (0..t * cols).map(|_| rng.normal() as f32).collect();
    let x_cpu = Tensor::from_vec(xs.clone(), (t, cols), &Device::Cpu).unwrap();
    let want: Vec<Vec<f32>> = ["a.weight", "b.weight", "c.weight"]
        .iter()
        .map(|n| {
            let m = layer.matrix(n, rows, cols).unwrap();
            dense(&x_cpu, &m)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        })
        .collect();
    let gpu = spine_device(&dev).expect("a Metal spine device");
    gpu.upload(&mut layer).unwrap();
    let x = x_cpu.to_device(&dev).unwrap();
    for (n, want) in ["a.weight", "b.weight", "c.weight"].iter().zip(&want) {
        let m = layer.matrix(n, rows, cols).unwrap();
        assert!(m.device.is_some(), "{n} has no device view after upload");
        let y = dense(&x, &m).unwrap();
        assert!(y.device().is_metal());
        let got: Vec<f32> = y.flatten_all().unwrap().to_vec1().unwrap();
        close(&got, want, 1e-6, n);
    }
}

/// The fused expert dispatch equals the CPU expert for every (expert, row) pair.
#[test]
fn metal_fused_experts_match_cpu() {
    let Some(Device::Metal(dev)) = metal() else {
        return;
    };
    let mut rng = Rng::new(5);
    let (inter, latent) = (64usize, 128usize);
    let one = |rng: &mut Rng| -> Vec<u8> {
        let mut v = Vec::new();
        for (r, c) in [(inter, latent), (latent, inter), (inter, latent)] {
            v.extend((0..r * c / 2).map(|_| rng.next_u64() as u8));
            v.extend((0..r * c / 32).map(|_| 118 + rng.below(12) as u8));
        }
        v
    };
    let spans: Vec<Vec<u8>> = (0..3).map(|_| one(&mut rng)).collect();
    let z: Vec<f32> = (0..2 * latent).map(|_| rng.normal() as f32).collect();
    let pairs = [(0usize, 0usize), (0, 1), (1, 0), (2, 1)];
    // Experts 0 and 2 in pooled page-aligned buffers (wrapped without a copy), 1 owned (staged).
    let pool = BufPool::new(4);
    let held: Vec<ExpertBytes> = spans
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if i == 1 {
                Arc::new(PooledBuf::owned(s.clone()))
            } else {
                let mut b = pool.take(s.len()).unwrap();
                b.copy_from_slice(s);
                Arc::new(b)
            }
        })
        .collect();
    use deltafin::moe::{Activation, ExpertFfn, GluLayout, Matrix, Part, PartKind, WeightFormat};
    let part = |matrix, kind| Part { matrix, kind };
    let ffn = ExpertFfn {
        format: WeightFormat::Mxfp4,
        width: latent,
        inter,
        glu: GluLayout::Separate,
        activation: Activation::Situ {
            beta: 1.5,
            linear_beta: 3.0,
        },
        parts: [Matrix::Gate, Matrix::Down, Matrix::Up]
            .into_iter()
            .flat_map(|m| [part(m, PartKind::Packed), part(m, PartKind::Scales)])
            .collect(),
    };
    assert!(
        ffn.metal_situ().is_some(),
        "K3's expert shape runs on Metal"
    );
    let got = run_experts(
        &Device::Metal(dev),
        &deltafin::moe::ExecOptions {
            kernel: Kernel::Scalar,
            ..Default::default()
        },
        &ffn,
        &held,
        &pairs,
        &z,
    )
    .unwrap();
    for (p, &(e, t)) in pairs.iter().enumerate() {
        let ex = Mxfp4Expert::from_span(&spans[e], inter, latent).unwrap();
        let want = ex
            .forward(
                Kernel::Scalar,
                &z[t * latent..(t + 1) * latent],
                1,
                1.5,
                3.0,
                false,
            )
            .unwrap();
        close(
            &got[p * latent..(p + 1) * latent],
            &want,
            1e-5,
            "expert pair",
        );
    }
}

/// The reusable `Mxfp4Weights` op runs on Metal and equals its CPU result.
#[test]
fn metal_mxfp4_op_matches_cpu() {
    let Some(dev) = metal() else { return };
    let mut rng = Rng::new(7);
    let (rows, cols) = (70usize, 256usize);
    let packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<u8> = (0..rows * cols / 32)
        .map(|_| 120 + rng.below(8) as u8)
        .collect();
    let w = Mxfp4Weights::new(packed, scales, rows, cols).unwrap();
    let xs: Vec<f32> = (0..2 * cols).map(|_| rng.normal() as f32).collect();
    let x = Tensor::from_vec(xs, (2, cols), &Device::Cpu).unwrap();
    let want: Vec<f32> = matvec(&x, &w)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let got: Vec<f32> = matvec(&x.to_device(&dev).unwrap(), &w)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    close(&got, &want, 1e-6, "mxfp4 op");
}

/// K3-nano on Metal (all layers pinned, and all streamed through the template layers) gives the
/// CPU's logits within 1e-4 and the same greedy token.
#[test]
fn metal_nano_model_matches_cpu() {
    let Some(dev) = metal() else { return };
    let ids = [12u32, 7, 99, 300, 45];
    let run = |device: &Device, resident: Option<u64>| -> Vec<f32> {
        let spine = SpineOptions {
            resident_bytes: resident,
            ..Default::default()
        };
        let m = K3Model::from_dir_with(&nano(), device, &TieredOptions::default(), None, &spine)
            .unwrap();
        let mut st = m.new_state();
        m.forward(&ids, &mut st).unwrap().to_vec1().unwrap()
    };
    let want = run(&Device::Cpu, None);
    let argmax = deltafin::runtime::generate::argmax;
    for resident in [None, Some(0)] {
        let got = run(&dev, resident);
        close(&got, &want, 1e-4, "nano logits");
        assert_eq!(
            argmax(&got),
            argmax(&want),
            "greedy token (resident {resident:?})"
        );
    }
}
