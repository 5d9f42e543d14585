//! Rotary position embedding as GPT-NeoX and its descendants apply it (gpt-oss, Qwen3): one
//! frequency per pair of dimensions, pairs (i, i + d/2) rather than adjacent, and a factor on
//! cos and sin (YaRN's attention factor; 1 without scaling). The frequencies are the family's
//! (`Rope::plain` for the unscaled `1/θ^(2i/d)`; gpt-oss builds YaRN's in its folder).
//! fp32 throughout, as the references compute it. Owns the rotation only.

/// The rotation of one layer's queries and keys.
#[derive(Debug, Clone)]
pub struct Rope {
    /// One frequency per pair `[d/2]`.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin.
    pub scale: f32,
}

impl Rope {
    /// Unscaled frequencies `1 / θ^(2i/d)` for heads of width `d`, computed in fp32 as the
    /// references' `base ** (arange(0, d, 2) / d)`.
    pub fn plain(theta: f64, d: usize) -> Rope {
        let base = theta as f32;
        Rope {
            inv_freq: (0..d / 2)
                .map(|i| 1.0 / base.powf((2 * i) as f32 / d as f32))
                .collect(),
            scale: 1.0,
        }
    }

    /// Rotates each head of `x` (`heads` rows of `d` values, one position) in place.
    pub fn apply(&self, x: &mut [f32], pos: usize, d: usize) {
        let half = d / 2;
        let (cos, sin): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|f| {
                let a = pos as f32 * f;
                (a.cos() * self.scale, a.sin() * self.scale)
            })
            .unzip();
        for head in x.chunks_exact_mut(d) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x1, x2) = (a[i], b[i]);
                a[i] = x1 * cos[i] - x2 * sin[i];
                b[i] = x2 * cos[i] + x1 * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_the_identity_and_pairs_are_half_a_head_apart() {
        let r = Rope::plain(10_000.0, 8);
        let x: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        let mut y = x.clone();
        r.apply(&mut y, 0, 8);
        assert_eq!(x, y);
        // The first pair (0, 4) turns by pos·1 radian; the rest of the head by less.
        let mut y = x.clone();
        r.apply(&mut y, 1, 8);
        let (c, s) = (1f32.cos(), 1f32.sin());
        assert!((y[0] - (x[0] * c - x[4] * s)).abs() < 1e-6);
        assert!((y[4] - (x[4] * c + x[0] * s)).abs() < 1e-6);
    }
}
