//! gpt-oss's rotary embedding: YaRN frequencies (interpolation blended into extrapolation over
//! a correction range of dimensions, rounded to whole dimensions only when the config's
//! `truncate` says so) and the attention factor `0.1·ln(factor) + 1` on cos and sin; pairs are
//! (i, i + d/2), not adjacent. Computed in fp32 as the published reference computes it.
//! Owns the frequencies; the rotation is `layers::rope`'s.

use super::config::GptOssConfig;
pub use crate::layers::rope::Rope;

/// Dimension at which `rotations` full turns fit the original context (YaRN).
fn correction_dim(rotations: f64, dim: usize, base: f64, context: usize) -> f64 {
    dim as f64 * (context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// The rotation of `cfg` (`rope_theta`, `head_dim`, `rope_scaling`; the same for every layer).
pub fn rope(cfg: &GptOssConfig) -> Rope {
    let d = cfg.head_dim;
    let base = cfg.rope_theta as f32;
    // base^(2i/d) in fp32, as the reference's `base ** (arange(0, d, 2) / d)`.
    let pos_freqs: Vec<f32> = (0..d / 2)
        .map(|i| base.powf((2 * i) as f32 / d as f32))
        .collect();
    let Some(y) = &cfg.rope_scaling else {
        return Rope {
            inv_freq: pos_freqs.iter().map(|p| 1.0 / p).collect(),
            scale: 1.0,
        };
    };
    let factor = y.factor;
    let ctx = y.original_max_position_embeddings;
    let mut low = correction_dim(y.beta_fast, d, cfg.rope_theta, ctx);
    let mut high = correction_dim(y.beta_slow, d, cfg.rope_theta, ctx);
    if y.truncate {
        low = low.floor();
        high = high.ceil();
    }
    let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
    if low == high {
        high += 0.001;
    }
    let (low, high) = (low as f32, high as f32);
    let inv_freq = pos_freqs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let extrapolation = 1.0 - ramp;
            let interp = 1.0 / (factor as f32 * p);
            interp * (1.0 - extrapolation) + (1.0 / p) * extrapolation
        })
        .collect();
    let scale = if factor <= 1.0 {
        1.0
    } else {
        (0.1 * factor.ln() + 1.0) as f32
    };
    Rope { inv_freq, scale }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(truncate: bool) -> GptOssConfig {
        let mut c: GptOssConfig =
            serde_json::from_str(super::super::config::tests::GPT_OSS_120B).unwrap();
        c.rope_scaling.as_mut().unwrap().truncate = truncate;
        c
    }

    #[test]
    fn yarn_blends_between_interpolation_and_extrapolation() {
        let r = rope(&cfg(false));
        let d = 64usize;
        let plain: Vec<f32> = (0..d / 2)
            .map(|i| 1.0 / 150000f32.powf((2 * i) as f32 / d as f32))
            .collect();
        // Below the range (low ≈ 8.09): extrapolation (the plain frequency); above (high ≈
        // 17.4): interpolation (plain / 32); between: strictly in between.
        assert_eq!(r.inv_freq[0], plain[0]);
        assert_eq!(r.inv_freq[8], plain[8]);
        assert!((r.inv_freq[18] - plain[18] / 32.0).abs() <= plain[18] * 1e-6);
        assert!(r.inv_freq[12] < plain[12] && r.inv_freq[12] > plain[12] / 32.0);
        assert!((r.scale - (0.1 * 32f32.ln() + 1.0)).abs() < 1e-6);
        // Truncation rounds the range outward: dimension 8 then interpolates a little less.
        let t = rope(&cfg(true));
        assert_ne!(t.inv_freq[9], r.inv_freq[9]);
    }

    #[test]
    fn rotation_keeps_norms_times_the_factor_squared() {
        let r = rope(&cfg(false));
        let mut x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let n0: f32 = x.iter().map(|v| v * v).sum();
        r.apply(&mut x, 777, 64);
        let n1: f32 = x.iter().map(|v| v * v).sum();
        assert!((n1 / n0 - r.scale * r.scale).abs() < 1e-4);
    }
}
