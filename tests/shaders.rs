//! `shader_*`: the Metal kernels' bodies (metal/*.metal), compiled as plain C++ through
//! metal/compat.h and run on the CPU over a simulated grid, must equal the Rust reference
//! kernels bit for bit.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use deltafin::checkpoint::rng::Rng;
use deltafin::kernels::dense::{quantize_row_int8, DenseData, DenseMatrix};
use deltafin::mxfp4::{gemm_with, Kernel, Mxfp4Expert, Mxfp4Matrix};

fn driver() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let exe = common::process_tempdir().join("cpu_driver");
        let metal = Path::new(env!("CARGO_MANIFEST_DIR")).join("metal");
        let out = Command::new(std::env::var("CXX").unwrap_or_else(|_| "c++".into()))
            .args([
                "-O2",
                "-std=c++17",
                "-ffp-contract=off",
                "-fsigned-char",
                "-Wno-attributes",
                "-x",
                "c++",
            ])
            .arg("-I")
            .arg(&metal)
            .arg(metal.join("cpu_driver.cpp"))
            .arg("-o")
            .arg(&exe)
            .output()
            .expect("a C++ compiler (c++, or $CXX) is needed for the shader tests");
        assert!(
            out.status.success(),
            "compiling the shaders as C++ failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        exe
    })
}

fn run(args: &[&str], inputs: &[&[u8]], n_out: usize) -> Vec<f32> {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(driver());
    cmd.args(args);
    for (i, b) in inputs.iter().enumerate() {
        let p = dir.path().join(format!("in{i}"));
        std::fs::write(&p, b).unwrap();
        cmd.arg(p);
    }
    let out = dir.path().join("out");
    cmd.arg(&out);
    let st = cmd.status().unwrap();
    assert!(st.success());
    let b = std::fs::read(out).unwrap();
    assert_eq!(b.len(), 4 * n_out);
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn shader_mxfp4_gemv_matches_rust_bit_for_bit() {
    let mut rng = Rng::new(8);
    for &(rows, cols) in &[(67usize, 320usize), (5, 32), (130, 96)] {
        let packed: Vec<u8> = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
        let scales: Vec<u8> = (0..rows * cols / 32)
            .map(|_| 100 + rng.below(55) as u8)
            .collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.normal() as f32).collect();
        let m = Mxfp4Matrix::new(&packed, &scales, rows, cols).unwrap();
        let mut want = vec![0f32; rows];
        gemm_with(Kernel::Scalar, &m, &x, 1, &mut want, false).unwrap();
        let got = run(
            &["mxfp4", &rows.to_string(), &cols.to_string()],
            &[&packed, &scales, &f32_bytes(&x)],
            rows,
        );
        for (r, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "row {r}: rust {a} vs shader {b}");
        }
    }
}

fn int8_matrix(rng: &mut Rng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let (mut q, mut sc) = (Vec::new(), Vec::new());
    for _ in 0..rows {
        let w: Vec<f32> = (0..cols).map(|_| rng.normal() as f32 * 0.05).collect();
        let (qq, s) = quantize_row_int8(&w);
        q.extend(qq.iter().map(|v| *v as u8));
        sc.extend(s.to_le_bytes());
    }
    (q, sc)
}

/// Checks the shader's `[tokens, rows]` output against `dot_row` for every token.
fn check_dense(m: &DenseMatrix, xs: &[f32], tokens: usize, got: &[f32]) {
    for t in 0..tokens {
        let x = &xs[t * m.cols..(t + 1) * m.cols];
        for r in 0..m.rows {
            let (want, g) = (m.dot_row(r, x), got[t * m.rows + r]);
            assert_eq!(
                want.to_bits(),
                g.to_bits(),
                "token {t} row {r}: rust {want} vs shader {g}"
            );
        }
    }
}

#[test]
fn shader_int8_gemv_matches_rust_bit_for_bit() {
    let mut rng = Rng::new(4);
    for &(rows, cols, tokens) in &[(50usize, 45usize, 1usize), (33, 64, 3), (7, 5, 2)] {
        let (q, sc) = int8_matrix(&mut rng, rows, cols);
        let x: Vec<f32> = (0..cols * tokens).map(|_| rng.normal() as f32).collect();
        let m = DenseMatrix::new(DenseData::I8 { q: &q, scales: &sc }, rows, cols).unwrap();
        let dims = [rows.to_string(), cols.to_string(), tokens.to_string()];
        let got = run(
            &["int8gemv", &dims[0], &dims[1], &dims[2]],
            &[&q, &sc, &f32_bytes(&x)],
            rows * tokens,
        );
        check_dense(&m, &x, tokens, &got);
    }
}

#[test]
fn shader_bf16_and_f32_gemv_match_rust_bit_for_bit() {
    let mut rng = Rng::new(6);
    for &(rows, cols, tokens) in &[(40usize, 77usize, 2usize), (9, 16, 1), (3, 200, 4)] {
        let w: Vec<f32> = (0..rows * cols)
            .map(|_| rng.normal() as f32 * 0.1)
            .collect();
        let x: Vec<f32> = (0..cols * tokens).map(|_| rng.normal() as f32).collect();
        let bf: Vec<u8> = w
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let f: Vec<u8> = f32_bytes(&w);
        let dims = [rows.to_string(), cols.to_string(), tokens.to_string()];
        for (kind, bytes, data) in [
            ("bf16gemv", &bf, DenseData::Bf16(&bf)),
            ("f32gemv", &f, DenseData::F32(&f)),
        ] {
            let m = DenseMatrix::new(data, rows, cols).unwrap();
            let got = run(
                &[kind, &dims[0], &dims[1], &dims[2]],
                &[bytes, &f32_bytes(&x)],
                rows * tokens,
            );
            check_dense(&m, &x, tokens, &got);
        }
    }
}

#[test]
fn shader_fused_experts_match_rust_expert_bit_for_bit() {
    // Three experts staged back to back; five (expert, row) pairs, one expert used twice.
    let mut rng = Rng::new(9);
    let (inter, latent) = (64usize, 96usize);
    let span = 3 * (inter * latent / 2 + inter * latent / 32);
    let stage: Vec<u8> = (0..3 * span)
        .map(|i| {
            // Scales are the bytes after each packed block; keep them in a sane E8M0 range.
            let off = i % span;
            let block = inter * latent / 2 + inter * latent / 32;
            if off % block >= inter * latent / 2 {
                118 + rng.below(12) as u8
            } else {
                rng.next_u64() as u8
            }
        })
        .collect();
    let pairs = [(0usize, 0usize), (2, 0), (1, 1), (2, 1), (0, 2)];
    let zrows: Vec<Vec<f32>> = (0..3)
        .map(|_| (0..latent).map(|_| rng.normal() as f32).collect())
        .collect();
    let base: Vec<u8> = pairs
        .iter()
        .flat_map(|(e, _)| ((e * span) as u64).to_le_bytes())
        .collect();
    let z: Vec<f32> = pairs.iter().flat_map(|(_, t)| zrows[*t].clone()).collect();
    let (beta, lbeta) = (1.7f32, 2.5f32);
    let dims = [inter, latent, pairs.len()].map(|v| v.to_string());
    let got = run(
        &[
            "experts",
            &dims[0],
            &dims[1],
            &dims[2],
            &beta.to_string(),
            &lbeta.to_string(),
        ],
        &[&stage, &base, &f32_bytes(&z)],
        latent * pairs.len(),
    );
    for (p, (e, t)) in pairs.iter().enumerate() {
        let ex = Mxfp4Expert::from_span(&stage[e * span..(e + 1) * span], inter, latent).unwrap();
        let want = ex
            .forward(Kernel::Scalar, &zrows[*t], 1, beta, lbeta, false)
            .unwrap();
        for (r, w) in want.iter().enumerate() {
            let g = got[p * latent + r];
            assert_eq!(
                w.to_bits(),
                g.to_bits(),
                "pair {p} row {r}: rust {w} vs shader {g}"
            );
        }
    }
}

#[test]
fn shader_int8_dequant_matches_rust_bit_for_bit() {
    let mut rng = Rng::new(5);
    let (rows, cols) = (19, 37);
    let (q, sc) = int8_matrix(&mut rng, rows, cols);
    let m = DenseMatrix::new(DenseData::I8 { q: &q, scales: &sc }, rows, cols).unwrap();
    let got = run(
        &["int8deq", &rows.to_string(), &cols.to_string()],
        &[&q, &sc],
        rows * cols,
    );
    for (i, g) in got.iter().enumerate() {
        let want = m.get(i / cols, i % cols);
        assert_eq!(want.to_bits(), g.to_bits(), "element {i}");
    }
}
