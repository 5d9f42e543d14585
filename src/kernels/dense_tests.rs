//! Tests of the dense kernels: exactness against f64, row exactness at every batch size,
//! the int8 rule.

use super::*;
use crate::checkpoint::rng::Rng;

#[test]
fn int8_rule_exact_bytes() {
    // amax 127 → scale exactly 1: ties at .5 round to even.
    let (q, s) = quantize_row_int8(&[127.0, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -127.0]);
    assert_eq!(q, vec![127, 2, 4, -2, 0, 0, 2, -127]);
    assert_eq!(s.to_f32(), 1.0);
    let (q, s) = quantize_row_int8(&[0.0; 5]);
    assert_eq!(q, vec![0; 5]);
    assert_eq!(s.to_f32(), 1.0);
    // amax 254 → scale 2: 5 → 2.5 → 2, 7 → 3.5 → 4
    let (q, s) = quantize_row_int8(&[254.0, 5.0, 7.0, -254.0]);
    assert_eq!(q, vec![127, 2, 4, -127]);
    assert_eq!(s.to_f32(), 2.0);
}

/// One random `[rows, cols]` matrix as F32, BF16 and row-int8 (values, scales) bytes.
fn formats(rng: &mut Rng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let w: Vec<f32> = (0..rows * cols).map(|_| rng.normal() as f32).collect();
    let bf = w
        .iter()
        .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
        .collect();
    let f = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let (mut q, mut sc) = (Vec::new(), Vec::new());
    for r in 0..rows {
        let (qq, s) = quantize_row_int8(&w[r * cols..(r + 1) * cols]);
        q.extend(qq.iter().map(|v| *v as u8));
        sc.extend(s.to_le_bytes());
    }
    (f, bf, q, sc)
}

/// The three formats' views of `formats`' bytes.
fn views<'a>(f: &'a [u8], bf: &'a [u8], q: &'a [u8], sc: &'a [u8]) -> [DenseData<'a>; 3] {
    [
        DenseData::F32(f),
        DenseData::Bf16(bf),
        DenseData::I8 { q, scales: sc },
    ]
}

#[test]
fn gemm_is_row_exact_at_every_batch_size() {
    // 70 rows: two full tiles and a short one, each ending in rows the block kernel leaves
    // to the row kernel; 45 columns: two chunks and a tail.
    let mut rng = Rng::new(9);
    let (rows, cols) = (70, 45);
    let (f, bf, q, sc) = formats(&mut rng, rows, cols);
    for data in views(&f, &bf, &q, &sc) {
        let m = DenseMatrix::new(data, rows, cols).unwrap();
        for t in 1..=9 {
            let xs: Vec<f32> = (0..t * cols).map(|_| rng.normal() as f32).collect();
            let mut ys = vec![0f32; t * rows];
            gemm(&m, &xs, t, &mut ys).unwrap();
            for tt in 0..t {
                let x = &xs[tt * cols..(tt + 1) * cols];
                let mut one = vec![0f32; rows];
                gemm(&m, x, 1, &mut one).unwrap();
                for r in 0..rows {
                    let (got, want) = (ys[tt * rows + r], one[r]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{data:?} t={t} row {r}");
                    assert_eq!(want.to_bits(), m.dot_row(r, x).to_bits());
                }
            }
        }
    }
}

#[test]
fn gemm_matches_f64_and_is_row_exact() {
    let mut rng = Rng::new(4);
    let (rows, cols) = (70, 45);
    let (f, bf, q, sc) = formats(&mut rng, rows, cols);
    let t = 3;
    let xs: Vec<f32> = (0..t * cols).map(|_| rng.normal() as f32).collect();
    for data in views(&f, &bf, &q, &sc) {
        let m = DenseMatrix::new(data, rows, cols).unwrap();
        let mut ys = vec![0f32; t * rows];
        gemm(&m, &xs, t, &mut ys).unwrap();
        for tt in 0..t {
            let mut one = vec![0f32; rows];
            gemm(&m, &xs[tt * cols..(tt + 1) * cols], 1, &mut one).unwrap();
            assert!(one
                .iter()
                .zip(&ys[tt * rows..])
                .all(|(a, b)| a.to_bits() == b.to_bits()));
            for (r, got) in one.iter().enumerate() {
                let exact: f64 = (0..cols)
                    .map(|c| m.get(r, c) as f64 * xs[tt * cols + c] as f64)
                    .sum();
                let mag: f64 = (0..cols)
                    .map(|c| (m.get(r, c) as f64 * xs[tt * cols + c] as f64).abs())
                    .sum();
                assert!((*got as f64 - exact).abs() <= 1e-5 * mag + 1e-6, "{data:?}");
            }
        }
    }
    assert!(DenseMatrix::new(DenseData::Bf16(&bf[1..]), rows, cols).is_err());
    // The SIMD kernel equals the portable one bit for bit.
    for data in views(&f, &bf, &q, &sc) {
        let m = DenseMatrix::new(data, rows, cols).unwrap();
        let xr: Vec<&[f32]> = xs.chunks(cols).collect();
        for r in 0..rows {
            let mut multi = vec![0f32; t];
            m.dot_row_multi(r, &xr, &mut multi);
            for (tt, v) in multi.iter().enumerate() {
                assert_eq!(
                    v.to_bits(),
                    m.dot_row(r, xr[tt]).to_bits(),
                    "row {r} input {tt}"
                );
            }
        }
    }
}

/// `DenseKernel::Fast`: the SIMD kernel (x86-64's `dense_fma`, aarch64's fused NEON blocks)
/// equals its plain-Rust statement (`DenseMatrix::fused_dot_row`) bit for bit in every format,
/// at every batch size (0 to 13 input rows: every block shape of both, 8 or 4 rows by 1 to 6
/// inputs on x86-64, 4 rows by 1 to 4 on aarch64, and lone rows; columns 45 and 7: a masked
/// last chunk; 96: none; 0; 1100: two whole column passes of the x86-64 kernel and a short
/// one ending in a masked chunk; 1024: two whole passes; 513: a last pass of one masked chunk),
/// and stays within fp32 accumulation of the f64 sum, as the exact kernel does.
#[test]
fn fast_kernel_equals_its_reference_at_every_batch_size() {
    if DenseKernel::Fast.effective() != DenseKernel::Fast {
        return;
    }
    let mut rng = Rng::new(17);
    for (rows, cols) in [
        (70, 45),
        (70, 96),
        (5, 7),
        (3, 0),
        (37, 1100),
        (37, 1024),
        (9, 513),
    ] {
        let (f, bf, q, sc) = formats(&mut rng, rows, cols);
        for data in views(&f, &bf, &q, &sc) {
            let exact = DenseMatrix::new(data, rows, cols).unwrap();
            let fast = exact.with_kernel(DenseKernel::Fast);
            let mut differ = 0;
            for t in [0, 1, 2, 3, 4, 5, 7, 13] {
                let xs: Vec<f32> = (0..t * cols).map(|_| rng.normal() as f32).collect();
                let (mut yf, mut ye) = (vec![0f32; t * rows], vec![0f32; t * rows]);
                gemm(&fast, &xs, t, &mut yf).unwrap();
                gemm(&exact, &xs, t, &mut ye).unwrap();
                for tt in 0..t {
                    let x = &xs[tt * cols..(tt + 1) * cols];
                    for r in 0..rows {
                        let got = yf[tt * rows + r];
                        let want = fast.fused_dot_row(r, x);
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "[{rows},{cols}] t {t} row {r}"
                        );
                        let (mut sum, mut abs) = (0f64, 0f64);
                        for (c, &xc) in x.iter().enumerate() {
                            let p = exact.get(r, c) as f64 * xc as f64;
                            sum += p;
                            abs += p.abs();
                        }
                        assert!((got as f64 - sum).abs() <= 1e-5 * abs, "{got} vs {sum}");
                        differ += usize::from(got != ye[tt * rows + r]);
                    }
                }
            }
            // With one step per lane (7 columns) a fused and an unfused step agree.
            if cols > 16 {
                assert!(
                    differ > 0,
                    "[{rows},{cols}]: the fast kernel ran the exact arithmetic"
                );
            }
        }
    }
}

/// `xt_w` (MLA's absorbed query): the exact steps equal `axpy_rows` bit for bit, the fused ones
/// `f32::mul_add` in row order, in every format, for every input of a batch as for that input
/// alone (batches of 0 to 13: every block of 1 to 6 inputs; columns 100: a 64-column block,
/// two whole 16-column vectors and a masked one; 45, 7, 0), on rows inside the matrix and on its
/// last rows (the masked reads end at the buffer's end), and the two arithmetics differ. On a
/// CPU with AVX-512 this checks the SIMD twin, elsewhere the portable path.
#[test]
fn xt_w_is_axpy_rows_and_batch_independent() {
    use crate::kernels::dense_xtw::xt_w;
    let mut rng = Rng::new(23);
    let (rows, n) = (20, 9);
    for (cols, r0) in [(100, 3), (45, 11), (7, 3), (0, 3), (100, 11)] {
        let (f, bf, q, sc) = formats(&mut rng, rows, cols);
        for data in views(&f, &bf, &q, &sc) {
            let exact = DenseMatrix::new(data, rows, cols).unwrap();
            let fast = exact.with_kernel(DenseKernel::Fast);
            let mut differ = 0;
            for t in [0, 1, 2, 3, 4, 5, 6, 7, 13] {
                let xs: Vec<f32> = (0..t * n).map(|_| rng.normal() as f32).collect();
                let (mut ye, mut yf) = (vec![1f32; t * cols], vec![1f32; t * cols]);
                xt_w(&exact, r0, n, &xs, t, &mut ye).unwrap();
                xt_w(&fast, r0, n, &xs, t, &mut yf).unwrap();
                for tt in 0..t {
                    let x = &xs[tt * n..(tt + 1) * n];
                    let mut want = vec![0f32; cols];
                    exact.axpy_rows(r0, x, &mut want);
                    let mut alone = vec![0f32; cols];
                    xt_w(&fast, r0, n, x, 1, &mut alone).unwrap();
                    for c in 0..cols {
                        let got = ye[tt * cols + c];
                        assert_eq!(got.to_bits(), want[c].to_bits(), "{data:?} t={t} col {c}");
                        let fused = (0..n).fold(0f32, |o, j| x[j].mul_add(exact.get(r0 + j, c), o));
                        let gf = yf[tt * cols + c];
                        if DenseKernel::Fast.effective() == DenseKernel::Fast {
                            assert_eq!(gf.to_bits(), fused.to_bits(), "{data:?} fused col {c}");
                        }
                        assert_eq!(gf.to_bits(), alone[c].to_bits(), "{data:?} t={t} col {c}");
                        differ += usize::from(gf != got);
                    }
                }
            }
            if cols > 0 && DenseKernel::Fast.effective() == DenseKernel::Fast {
                assert!(
                    differ > 0,
                    "{data:?} [{rows},{cols}]: fused steps ran exact"
                );
            }
        }
    }
    let m = DenseMatrix::new(DenseData::F32(&[0; 16]), 2, 2).unwrap();
    assert!(xt_w(&m, 1, 2, &[0.0; 2], 1, &mut [0.0; 2]).is_err());
}

/// `row_range` views rows `r0..r0 + n` of every format (row-int8's scales included): its GEMM
/// equals those rows of the whole matrix's; a range past the end is an error.
#[test]
fn row_range_is_the_rows_of_the_matrix() {
    let mut rng = Rng::new(29);
    let (rows, cols, t) = (40, 45, 3);
    let (f, bf, q, sc) = formats(&mut rng, rows, cols);
    let xs: Vec<f32> = (0..t * cols).map(|_| rng.normal() as f32).collect();
    for data in views(&f, &bf, &q, &sc) {
        let m = DenseMatrix::new(data, rows, cols).unwrap();
        let mut all = vec![0f32; t * rows];
        gemm(&m, &xs, t, &mut all).unwrap();
        for (r0, n) in [(0, 40), (7, 33), (39, 1), (12, 0)] {
            let v = m.row_range(r0, n).unwrap();
            let mut part = vec![0f32; t * n];
            gemm(&v, &xs, t, &mut part).unwrap();
            for tt in 0..t {
                for k in 0..n {
                    let (got, want) = (part[tt * n + k], all[tt * rows + r0 + k]);
                    assert_eq!(got.to_bits(), want.to_bits(), "{data:?} rows {r0}+{n}");
                }
            }
        }
        assert!(m.row_range(30, 11).is_err());
    }
}
