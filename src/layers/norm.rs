//! RMSNorm as the references compute it in fp32: `w · (x / sqrt(mean(x²) + eps))` per row of
//! `w.len()` values (a model's hidden rows, or one head's rows for Qwen3's q/k norms). Rows run
//! in parallel, each computed the same way whatever the row count, so a batched pass changes no
//! bit. Owns the arithmetic only.

use rayon::prelude::*;

/// `w · x / sqrt(mean(x²) + eps)` per row of `x`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    out.par_chunks_mut(w.len())
        .zip(x.par_chunks(w.len()))
        .for_each(|(o, r)| {
            let ms = r.iter().map(|v| v * v).sum::<f32>() / r.len() as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            for ((a, b), c) in o.iter_mut().zip(r).zip(w) {
                *a = c * (b * inv);
            }
        });
    out
}
