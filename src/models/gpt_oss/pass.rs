//! gpt-oss as a row-cache family (`layers::row_pass::RowPass`): one decoder layer over the rows
//! of one or several sequences (a batched pass). Every matrix (attention's projections, the
//! router, each distinct selected expert) is applied to all the pass's rows at once, so a batch
//! reads each expert once for all its sequences, while attention runs per sequence over its own
//! key/value cache at its own positions (tests/gpt_oss_batch.rs: each sequence bit-identical to
//! running it alone). Owns the layer's order; the weights and kernels are `model.rs`'s.

use super::weights::Layer;
use super::GptOssModel;
use crate::layers::attention::attend_seqs;
use crate::layers::norm::rms_norm;
use crate::layers::row_pass::{PassSeq, RowPass};
use crate::runtime::observe::{Observer, Observers};
use crate::runtime::state::SeqState;
use crate::Result;

impl RowPass for GptOssModel {
    fn hidden_size(&self) -> usize {
        self.config().hidden_size
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn layer_count(&self) -> usize {
        self.config().num_hidden_layers
    }

    fn pass_len(&self) -> usize {
        GptOssModel::pass_len(self)
    }

    fn bytes_read(&self) -> u64 {
        GptOssModel::bytes_read(self)
    }

    fn observers(&self) -> &Observers {
        GptOssModel::observers(self)
    }

    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        GptOssModel::check_input(self, ids, state)
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
        let layer = GptOssModel::layer(self, l);
        self.attention(l, layer, x, seqs)?;
        self.mlp(l, layer, x, obs)
    }

    fn logits(&self, x: &[f32], t: usize) -> Result<Vec<f32>> {
        GptOssModel::logits(self, x, t)
    }
}

impl GptOssModel {
    /// `x += o(attn(rope(q), rope(k), v))` after the input norm: the projections over every
    /// row of the pass, rotation, cache append and attention (with the layer's sinks and
    /// window) per sequence.
    fn attention(
        &self,
        l: usize,
        layer: &Layer,
        x: &mut [f32],
        seqs: &mut [PassSeq<'_>],
    ) -> Result<()> {
        let (h, s) = (self.config().hidden_size, layer.shape);
        let t = x.len() / h;
        let n = rms_norm(x, &layer.input_norm, self.config().rms_norm_eps as f32);
        let mut q = self.linear(&layer.q, &n, t)?;
        let k = self.linear(&layer.k, &n, t)?;
        let v = self.linear(&layer.v, &n, t)?;
        let scale = 1.0 / (s.d as f32).sqrt();
        let sinks = Some(layer.sinks.as_slice());
        let a = attend_seqs(l, &s, self.rope(), &mut q, &k, &v, seqs, sinks, scale)?;
        let o = self.linear(&layer.o, &a, t)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
