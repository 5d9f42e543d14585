//! `shader_*`: the Metal kernels' bodies (metal/*.metal), compiled as plain C++ through
//! metal/compat.h and run on the CPU over a simulated grid, must equal the Rust reference
//! kernels bit for bit.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use deltafin::checkpoint::rng::Rng;
use deltafin::mxfp4::{gemm_with, Kernel, Mxfp4Matrix};
use deltafin::spine::dense::{quantize_row_int8, DenseData, DenseMatrix};

fn driver() -> &'static PathBuf {
    static D: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &D.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("cpu_driver");
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
        (dir, exe)
    })
    .1
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

#[test]
fn shader_int8_gemv_matches_rust_bit_for_bit() {
    let mut rng = Rng::new(4);
    for &(rows, cols) in &[(50usize, 45usize), (33, 64), (7, 5)] {
        let (q, sc) = int8_matrix(&mut rng, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| rng.normal() as f32).collect();
        let m = DenseMatrix::new(DenseData::I8 { q: &q, scales: &sc }, rows, cols).unwrap();
        let got = run(
            &["int8gemv", &rows.to_string(), &cols.to_string()],
            &[&q, &sc, &f32_bytes(&x)],
            rows,
        );
        for (r, g) in got.iter().enumerate() {
            let want = m.dot_row(r, &x);
            assert_eq!(
                want.to_bits(),
                g.to_bits(),
                "row {r}: rust {want} vs shader {g}"
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
