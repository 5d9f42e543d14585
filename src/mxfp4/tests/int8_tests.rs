//! The int8-activation kernels against the exact product (their bit-identity to the int8
//! reference is `every_kernel_is_bit_identical_to_its_reference`).

use super::super::int8::Q8Input;
use super::*;

/// Each quantized input is within half a step (`max|x_g| / 254`) of its value, so a row's
/// result is within `Σ_g Σ_j |w_j| · max|x_g| / 254` (plus fp32 rounding) of the exact product.
#[test]
fn int8_error_is_within_the_quantization_bound() {
    let mut rng = Rng::new(23);
    let (rows, cols) = (64usize, 2880usize);
    let (p, s) = random_matrix(&mut rng, rows, cols);
    let m = Mxfp4Matrix::new(&p, &s, rows, cols).unwrap();
    let w = dequantize(&m);
    let x = random_x(&mut rng, cols);
    let q = Q8Input::new(&x);
    assert_eq!(q.pairs, cols / GROUP / 2);
    for k in Kernel::available().into_iter().filter(|k| !k.is_exact()) {
        let mut y = vec![0f32; rows];
        gemm_with(k, &m, &x, 1, &mut y, true).unwrap();
        let mut worst = 0f64;
        for r in 0..rows {
            let (mut exact, mut mag, mut bound) = (0f64, 0f64, 0f64);
            for (g, xg) in x.chunks(GROUP).enumerate() {
                let amax = xg.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                for (j, &xv) in xg.iter().enumerate() {
                    let wv = w[r * cols + g * GROUP + j] as f64;
                    exact += wv * xv as f64;
                    mag += (wv * xv as f64).abs();
                    bound += wv.abs() * amax / 254.0;
                }
            }
            let err = (y[r] as f64 - exact).abs();
            assert!(
                err <= bound * 1.001 + 1e-6 * mag,
                "{k:?} row {r}: {} vs {exact} (err {err}, bound {bound})",
                y[r]
            );
            worst = worst.max(err / mag);
        }
        // Random signs: the errors mostly cancel, far inside the bound.
        assert!(worst < 5e-3, "{k:?}: worst error {worst} of Σ|w·x|");
    }
}
