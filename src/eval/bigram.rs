//! The baseline a trained model must beat: an add-k smoothed bigram over the training tokens,
//! scored on exactly the positions `eval::nll` scores (every target with its previous token).

use std::collections::HashMap;

/// Bigram counts over a token stream.
pub struct Bigram {
    pairs: HashMap<(u32, u32), u32>,
    firsts: HashMap<u32, u32>,
    vocab: usize,
}

/// One smoothing constant's held-out score.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BigramScore {
    /// The add-k constant.
    pub k: f64,
    /// Average NLL, nats per token.
    pub nll: f64,
}

impl Bigram {
    /// Counts the bigrams of `tokens` over a vocabulary of `vocab` ids.
    pub fn train(tokens: &[u32], vocab: usize) -> Self {
        let mut pairs = HashMap::new();
        let mut firsts = HashMap::new();
        for w in tokens.windows(2) {
            *pairs.entry((w[0], w[1])).or_insert(0) += 1;
            *firsts.entry(w[0]).or_insert(0) += 1;
        }
        Bigram {
            pairs,
            firsts,
            vocab,
        }
    }

    /// `-ln p(b | a)` with add-`k` smoothing.
    pub fn nll_of(&self, a: u32, b: u32, k: f64) -> f64 {
        let c = *self.pairs.get(&(a, b)).unwrap_or(&0) as f64;
        let n = *self.firsts.get(&a).unwrap_or(&0) as f64;
        -((c + k) / (n + k * self.vocab as f64)).ln()
    }

    /// Average NLL over the targets of `windows` (each window's tokens after the first).
    pub fn score(&self, windows: &[&[u32]], k: f64) -> BigramScore {
        let mut total = 0f64;
        let mut n = 0usize;
        for w in windows {
            for p in w.windows(2) {
                total += self.nll_of(p[0], p[1], k);
                n += 1;
            }
        }
        BigramScore {
            k,
            nll: total / n.max(1) as f64,
        }
    }

    /// The best score over a grid of k (the strongest add-k baseline; chosen on the scored text
    /// itself, which can only favour the bigram).
    pub fn best(&self, windows: &[&[u32]]) -> BigramScore {
        [1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001]
            .iter()
            .map(|&k| self.score(windows, k))
            .min_by(|a, b| a.nll.total_cmp(&b.nll))
            .unwrap_or(BigramScore {
                k: 1.0,
                nll: f64::NAN,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bigram_probabilities_sum_to_one() {
        let toks = [0u32, 1, 2, 1, 2, 0, 1];
        let b = Bigram::train(&toks, 4);
        for a in 0..4 {
            let s: f64 = (0..4).map(|x| (-b.nll_of(a, x, 0.1)).exp()).sum();
            assert!((s - 1.0).abs() < 1e-12, "{a}: {s}");
        }
        // 1 is always followed by 2.
        assert!(b.nll_of(1, 2, 0.01) < b.nll_of(1, 0, 0.01));
    }
}
