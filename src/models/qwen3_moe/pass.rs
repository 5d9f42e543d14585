//! Qwen3-MoE as a row-cache family (`layers::row_pass::RowPass`): one decoder layer over the
//! rows of one or several sequences. Attention: RMSNorm, q/k/v projections (no biases), an
//! RMSNorm over each query and key head (`q_norm`, `k_norm`) before the rotation, grouped-query
//! causal attention scaled by `1/√head_dim`, the output projection; then RMSNorm and either the
//! routed experts (softmax over every expert, the top k, renormalised when `norm_topk_prob`)
//! or a dense SwiGLU MLP. Every matrix is applied to all the pass's rows at once, attention runs
//! per sequence. Owns the layer's order; the weights are `model.rs`'s.

use super::weights::{Layer, Mlp};
use super::Qwen3MoeModel;
use crate::layers::attention::attend_seqs;
use crate::layers::norm::rms_norm;
use crate::layers::row_pass::{PassSeq, RowPass};
use crate::moe::{Activation, Gating, Route};
use crate::runtime::observe::{Event, Observer, Observers};
use crate::runtime::state::SeqState;
use crate::Result;

impl RowPass for Qwen3MoeModel {
    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn layer_count(&self) -> usize {
        self.layers.len()
    }

    fn pass_len(&self) -> usize {
        Qwen3MoeModel::pass_len(self)
    }

    fn bytes_read(&self) -> u64 {
        Qwen3MoeModel::bytes_read(self)
    }

    fn observers(&self) -> &Observers {
        &self.observers
    }

    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        Qwen3MoeModel::check_input(self, ids, state)
    }

    fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        Ok(self.embed_rows(ids))
    }

    fn layer(
        &self,
        l: usize,
        x: &mut [f32],
        seqs: &mut [PassSeq<'_>],
        obs: &dyn Observer,
    ) -> Result<()> {
        let layer = &self.layers[l];
        self.attention(l, layer, x, seqs)?;
        self.mlp(l, layer, x, obs)
    }

    fn logits(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        Qwen3MoeModel::logits(self, x, t)
    }
}

impl Qwen3MoeModel {
    /// `x += o(attn(rope(q_norm(q)), rope(k_norm(k)), v))` after the input norm.
    fn attention(
        &self,
        l: usize,
        layer: &Layer,
        x: &mut [f32],
        seqs: &mut [PassSeq<'_>],
    ) -> Result<()> {
        let (h, s) = (self.cfg.hidden_size, layer.shape);
        let eps = self.cfg.rms_norm_eps as f32;
        let t = x.len() / h;
        let n = rms_norm(x, &layer.input_norm, eps);
        // The head norms run over each head's `head_dim` values.
        let mut q = rms_norm(&self.maps.matmul(&layer.q, &n, t)?, &layer.q_norm, eps);
        let k = rms_norm(&self.maps.matmul(&layer.k, &n, t)?, &layer.k_norm, eps);
        let v = self.maps.matmul(&layer.v, &n, t)?;
        let scale = 1.0 / (s.d as f32).sqrt();
        let a = attend_seqs(l, &s, &self.rope, &mut q, &k, &v, seqs, None, scale)?;
        let o = self.maps.matmul(&layer.o, &a, t)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        Ok(())
    }

    /// `x += mlp(post_norm(x))`: the routed experts or the layer's dense MLP.
    fn mlp(&self, l: usize, layer: &Layer, x: &mut [f32], obs: &dyn Observer) -> Result<()> {
        let h = self.cfg.hidden_size;
        let t = x.len() / h;
        let n = rms_norm(x, &layer.post_norm, self.cfg.rms_norm_eps as f32);
        let y = match &layer.mlp {
            Mlp::Moe { router } => {
                let logits = self.maps.matmul(router, &n, t)?;
                let gating = Gating::Softmax {
                    renormalize: self.cfg.norm_topk_prob,
                };
                let routes: Vec<Route> = logits
                    .chunks_exact(self.cfg.num_experts)
                    .map(|r| gating.route(r, &[], self.moe.top_k))
                    .collect();
                obs.on(l, &Event::Routes(&routes));
                self.moe.run(
                    l,
                    &routes,
                    n,
                    &candle::Device::Cpu,
                    self.experts.as_ref(),
                    &self.exec,
                )?
            }
            Mlp::Dense { gate, up, down } => {
                let g = self.maps.matmul(gate, &n, t)?;
                let u = self.maps.matmul(up, &n, t)?;
                let a: Vec<f32> = g
                    .iter()
                    .zip(&u)
                    .map(|(&g, &u)| Activation::Silu.apply(g, u))
                    .collect();
                self.maps.matmul(down, &a, t)?
            }
        };
        x.iter_mut().zip(&y).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
