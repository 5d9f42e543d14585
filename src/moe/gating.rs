//! Routing: from one position's router logits to its top-k experts and their weights, for the
//! gating functions MoE models use. Owns no weights (the router matrix is the model's).

/// The routing decision for one position.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Selected experts, best first (ties: lower id first).
    pub experts: Vec<usize>,
    /// Their weights, in the same order.
    pub weights: Vec<f32>,
}

/// How router logits become a top-k selection and weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gating {
    /// Sigmoid scores; the top k of `score + bias` are selected (the bias only selects), and the
    /// weights are the raw scores, renormalised to sum 1 (`+1e-20`) when `renormalize` (K3,
    /// DeepSeek-V3).
    SigmoidBias {
        /// Divide the k weights by their sum.
        renormalize: bool,
    },
    /// Softmax over all experts, the top k probabilities selected, renormalised when
    /// `renormalize` (Qwen3-MoE's `norm_topk_prob`, Mixtral).
    Softmax {
        /// Divide the k weights by their sum.
        renormalize: bool,
    },
    /// The top k logits selected, the weights a softmax over those k (gpt-oss).
    TopKSoftmax,
}

impl Gating {
    /// Routes one position: `logits` has one value per expert; `bias` (one per expert, or
    /// empty for none) is added for selection by `SigmoidBias`.
    pub fn route(&self, logits: &[f32], bias: &[f32], k: usize) -> Route {
        match *self {
            Gating::SigmoidBias { renormalize } => {
                let s: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
                let choice: Vec<f32> = if bias.is_empty() {
                    s.clone()
                } else {
                    s.iter().zip(bias).map(|(a, b)| a + b).collect()
                };
                let idx = top_k(&choice, k);
                let w = idx.iter().map(|&i| s[i]).collect();
                finish(idx, w, renormalize)
            }
            Gating::Softmax { renormalize } => {
                let p = softmax(logits);
                let idx = top_k(&p, k);
                let w = idx.iter().map(|&i| p[i]).collect();
                finish(idx, w, renormalize)
            }
            Gating::TopKSoftmax => {
                let idx = top_k(logits, k);
                let sel: Vec<f32> = idx.iter().map(|&i| logits[i]).collect();
                Route {
                    experts: idx,
                    weights: softmax(&sel),
                }
            }
        }
    }
}

/// Indices of the `k` largest values, largest first, ties to the lower index.
fn top_k(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// A numerically stable softmax (max subtracted).
fn softmax(v: &[f32]) -> Vec<f32> {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = v.iter().map(|&x| (x - m).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

fn finish(experts: Vec<usize>, mut weights: Vec<f32>, renormalize: bool) -> Route {
    if renormalize {
        let sum = weights.iter().fold(0f32, |a, b| a + b) + 1e-20;
        weights.iter_mut().for_each(|x| *x /= sum);
    }
    Route { experts, weights }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigmoid_bias_uses_bias_for_selection_only() {
        let g = Gating::SigmoidBias { renormalize: true };
        let r = g.route(&[0.0, 1.0, -1.0, 2.0], &[0.0, 0.0, 10.0, 0.0], 2);
        assert_eq!(r.experts, vec![2, 3]);
        let s = |l: f32| 1.0 / (1.0 + (-l).exp());
        let sum = s(-1.0) + s(2.0) + 1e-20;
        assert_eq!(r.weights, vec![s(-1.0) / sum, s(2.0) / sum]);
    }

    #[test]
    fn softmax_gatings_select_and_weigh() {
        let logits = [1.0f32, 3.0, 2.0, -1.0];
        let r = Gating::TopKSoftmax.route(&logits, &[], 2);
        assert_eq!(r.experts, vec![1, 2]);
        let (a, b) = (3f32.exp(), 2f32.exp());
        assert!((r.weights[0] - a / (a + b)).abs() < 1e-6);
        let r = Gating::Softmax { renormalize: false }.route(&logits, &[], 2);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert_eq!(r.experts, vec![1, 2]);
        assert!((r.weights[1] - 2f32.exp() / z).abs() < 1e-6);
        let r = Gating::Softmax { renormalize: true }.route(&logits, &[], 2);
        assert!((r.weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn ties_pick_lower_index() {
        let r = Gating::SigmoidBias { renormalize: false }.route(&[0.5; 3], &[0.0; 3], 2);
        assert_eq!(r.experts, vec![0, 1]);
    }
}
