use super::*;
use crate::checkpoint::rng::Rng;

fn random_matrix(rng: &mut Rng, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let packed = (0..rows * cols / 2).map(|_| rng.next_u64() as u8).collect();
    // Scales 100..=154: large dynamic range, no 0/255 (whose NaN payloads are unspecified).
    let scales = (0..rows * cols / GROUP)
        .map(|_| 100 + rng.below(55) as u8)
        .collect();
    (packed, scales)
}

fn random_x(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// Runs every available kernel of `reference`'s arithmetic (exact or int8), serial and parallel,
/// asserting each output bit-identical to `reference`'s, and each input's output the one it gets
/// alone (from the fastest kernel of that arithmetic).
fn same_bits_as_reference(reference: Kernel, m: &Mxfp4Matrix, xs: &[f32], t: usize) {
    let (rows, cols) = (m.rows, m.cols);
    let mut want = vec![0f32; t * rows];
    gemm_with(reference, m, xs, t, &mut want, false).unwrap();
    let kernels: Vec<Kernel> = Kernel::available()
        .into_iter()
        .filter(|k| k.is_exact() == reference.is_exact())
        .collect();
    for &k in &kernels {
        for par in [false, true] {
            let mut got = vec![0f32; t * rows];
            gemm_with(k, m, xs, t, &mut got, par).unwrap();
            for (i, (a, b)) in want.iter().zip(&got).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{k:?} rows {rows} cols {cols} t {t} out {i}: {a} vs {b}"
                );
            }
        }
    }
    let fastest = *kernels.last().unwrap();
    for (x, w) in xs.chunks(cols).zip(want.chunks(rows)) {
        let mut one = vec![0f32; rows];
        gemm_with(fastest, m, x, 1, &mut one, true).unwrap();
        assert!(one.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn decode_is_low_nibble_first() {
    // byte 0x71: low nibble 1 (0.5), high nibble 7 (6); scale 127 → 1.0; 128 → 2.0
    let packed = [0x71u8, 0x8F, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let scales = [128u8];
    let m = Mxfp4Matrix::new(&packed, &scales, 1, 32).unwrap();
    assert_eq!(m.get(0, 0), 1.0);
    assert_eq!(m.get(0, 1), 12.0);
    assert_eq!(m.get(0, 2), -12.0); // 0xF low
    assert_eq!(m.get(0, 3).to_bits(), (-0.0f32).to_bits()); // 0x8 high
    assert_eq!(e8m0(127), 1.0);
    assert_eq!(e8m0(0), 0.0);
    assert_eq!(e8m0(1), f32::MIN_POSITIVE);
}

#[test]
fn rejects_bad_sizes() {
    assert!(Mxfp4Matrix::new(&[0; 16], &[0; 1], 1, 31).is_err());
    assert!(Mxfp4Matrix::new(&[0; 15], &[0; 1], 1, 32).is_err());
    assert!(Mxfp4Matrix::new(&[0; 16], &[0; 2], 1, 32).is_err());
    let m = Mxfp4Matrix::new(&[0; 16], &[0; 1], 1, 32).unwrap();
    let mut y = [0f32; 1];
    assert!(gemv(&m, &[0.0; 31], &mut y).is_err());
}

/// Every exact kernel against `Scalar` and every int8 one against `Int8`, on odd group counts
/// (a half pair at the end for int8), more than 16 groups (a second scale load), row and input
/// counts that leave every tile remainder, zero and subnormal scales and inputs.
#[test]
fn every_kernel_is_bit_identical_to_its_reference() {
    let mut rng = Rng::new(11);
    for &(rows, cols) in &[
        (1usize, 32usize),
        (3, 64),
        (67, 320),
        (130, 96),
        (64, 3584 / 4),
        (9, 64),
        (5, 96),
        (7, 544),
        (130, 2880),
    ] {
        let (p, mut s) = random_matrix(&mut rng, rows, cols);
        if rows == 9 {
            // Scales 0..=40: zero and the subnormal weights (2^-128 ..) the decode tables hold.
            s.iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b = (i % 41) as u8);
        }
        let m = Mxfp4Matrix::new(&p, &s, rows, cols).unwrap();
        for t in [1usize, 2, 3, 5, 11] {
            let mut xs = random_x(&mut rng, t * cols);
            // A zero group, a subnormal group and one huge value.
            xs[..GROUP].iter_mut().for_each(|v| *v = 0.0);
            if xs.len() >= 2 * GROUP {
                xs[GROUP..2 * GROUP].iter_mut().for_each(|v| *v *= 1e-40);
            }
            xs[cols - 1] = 3e4;
            same_bits_as_reference(Kernel::Scalar, &m, &xs, t);
            same_bits_as_reference(Kernel::Int8, &m, &xs, t);
        }
    }
}

/// Tolerance: |y − y_f64| ≤ 2e-6 · Σ|w·x| + 1e-30 (fp32 accumulation over ≤ 112 groups per lane).
#[test]
fn kernels_match_f64_dequant_matmul() {
    let mut rng = Rng::new(5);
    for &(rows, cols) in &[(96usize, 3584usize), (200, 64)] {
        let (p, s) = random_matrix(&mut rng, rows, cols);
        let m = Mxfp4Matrix::new(&p, &s, rows, cols).unwrap();
        let w = dequantize(&m);
        let x = random_x(&mut rng, cols);
        for k in Kernel::available().into_iter().filter(|k| k.is_exact()) {
            let mut y = vec![0f32; rows];
            gemm_with(k, &m, &x, 1, &mut y, true).unwrap();
            for r in 0..rows {
                let (mut exact, mut mag) = (0f64, 0f64);
                for c in 0..cols {
                    let v = w[r * cols + c] as f64 * x[c] as f64;
                    exact += v;
                    mag += v.abs();
                }
                let err = (y[r] as f64 - exact).abs();
                assert!(
                    err <= 2e-6 * mag + 1e-30,
                    "{k:?} row {r}: {} vs {exact} (err {err}, mag {mag})",
                    y[r]
                );
            }
        }
    }
}

#[test]
fn quantize_round_trips_representable_values() {
    let mut rng = Rng::new(3);
    let (p, s) = random_matrix(&mut rng, 4, 64);
    let m = Mxfp4Matrix::new(&p, &s, 4, 64).unwrap();
    let w = dequantize(&m);
    let (p2, s2) = quantize(&w, 4, 64);
    let m2 = Mxfp4Matrix::new(&p2, &s2, 4, 64).unwrap();
    let w2 = dequantize(&m2);
    for (a, b) in w.iter().zip(&w2) {
        assert_eq!(a, b);
    }
}

#[test]
fn candle_op_matches_dequant_matmul() {
    let mut rng = Rng::new(9);
    let (rows, cols) = (48, 96);
    let (p, s) = random_matrix(&mut rng, rows, cols);
    let w = Mxfp4Weights::new(p, s, rows, cols).unwrap();
    let dev = candle::Device::Cpu;
    let x = candle::Tensor::from_vec(random_x(&mut rng, 3 * cols), (3, cols), &dev).unwrap();
    let y = matvec(&x, &w).unwrap();
    assert_eq!(y.dims(), &[3, rows]);
    let reference = x.matmul(&w.dequantize(&dev).unwrap().t().unwrap()).unwrap();
    let scale = reference
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let diff = (y - reference)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff <= 1e-5 * scale, "{diff} vs max {scale}");
}

#[test]
fn expert_forward_matches_scalar_reference() {
    let mut rng = Rng::new(21);
    let (inter, latent) = (96, 64);
    let mut span = Vec::new();
    for (r, c) in [(inter, latent), (latent, inter), (inter, latent)] {
        let (p, s) = random_matrix(&mut rng, r, c);
        span.extend(p);
        span.extend(s);
    }
    let e = Mxfp4Expert::from_span(&span, inter, latent).unwrap();
    assert!(Mxfp4Expert::from_span(&span[1..], inter, latent).is_err());
    let z = random_x(&mut rng, 2 * latent);
    let a = e.forward(Kernel::Scalar, &z, 2, 4.0, 25.0, false).unwrap();
    let b = e.forward(Kernel::best(), &z, 2, 4.0, 25.0, true).unwrap();
    assert_eq!(a.len(), 2 * latent);
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn effective_kernel_names_the_fallback() {
    for k in Kernel::ALL {
        let e = k.effective();
        assert!(Kernel::available().contains(&e));
        assert_eq!(e == k, Kernel::available().contains(&k), "{k:?} -> {e:?}");
        // A fallback keeps the arithmetic: an int8 kernel never falls back to an exact one.
        assert_eq!(e.is_exact(), k.is_exact(), "{k:?} -> {e:?}");
    }
    assert!(Kernel::best().is_exact());
    // No x86 CPU has NEON: asking for it runs (and is reported as) scalar.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(Kernel::Neon.effective(), Kernel::Scalar);
}

mod int8_tests;
