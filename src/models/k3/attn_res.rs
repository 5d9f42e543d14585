//! Block Attention Residuals (spec §3.3): depth attention over the completed block
//! representations and the current partial sum, with a learned pseudo-query.

use candle::{Tensor, D};

use super::ops::{rms_normalize, sum_last_keepdim};

/// AttnRes weights: `w_norm ⊙ w_proj`, precomputed once.
#[derive(Debug, Clone)]
pub struct AttnRes {
    query: Tensor,
    eps: f64,
}

impl AttnRes {
    /// From the norm weight `[H]` and projection `[1, H]`.
    pub fn new(norm: &Tensor, proj: &Tensor, eps: f64) -> candle::Result<Self> {
        Ok(AttnRes {
            query: norm.mul(&proj.squeeze(0)?)?,
            eps,
        })
    }

    /// `Σ_i softmax_i(q · RMSNorm(v_i)) v_i` for values each `[T, H]`.
    pub fn forward(&self, values: &[&Tensor]) -> candle::Result<Tensor> {
        let v = Tensor::stack(values, 0)?; // [n, T, H]
        let k = rms_normalize(&v, self.eps)?;
        let s = sum_last_keepdim(&k.broadcast_mul(&self.query)?)?.squeeze(D::Minus1)?; // [n, T]
        let p = candle_nn::ops::softmax(&s, 0)?;
        v.broadcast_mul(&p.unsqueeze(D::Minus1)?)?.sum(0)
    }
}
