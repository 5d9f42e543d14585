//! One pass of gpt-oss over the rows of one or several sequences (a batched pass): every
//! matrix (attention's projections, the router, each distinct selected expert) is applied to
//! all the pass's rows at once, so a batch reads each expert once for all its sequences, while
//! attention runs per sequence over its own key/value cache at its own positions. Every op
//! computes a row the same way whatever else is in the pass (the dense kernels agree bit for
//! bit across row counts, norms and the MoE work per row), so a sequence's rows are
//! bit-identical to running it alone (tests/gpt_oss_batch.rs). Owns the layer loop; the
//! weights and kernels are `model.rs`'s.

use std::sync::atomic::{AtomicBool, Ordering};

use super::attention::attend;
use super::model::rms_norm;
use super::weights::Layer;
use super::GptOssModel;
use crate::runtime::observe::{Event, Observer, PrefillStep};
use crate::runtime::state::{LayerState, SeqState};
use crate::{Error, Result};

/// One sequence's part of a pass: its new ids and its state (advanced by the pass).
pub(super) struct PassSeq<'a> {
    /// The positions fed.
    pub ids: &'a [u32],
    /// The sequence's state.
    pub state: &'a mut SeqState,
}

impl GptOssModel {
    /// The final hidden rows `[Σ T, hidden]` (each sequence's rows in order) after the last
    /// layer, before the final norm, or `None` when `cancel` was set between layers (the states
    /// then hold part of the pass: the caller rewinds them). With `prefill`, each layer is
    /// reported as a step of it.
    pub(super) fn hidden_seqs(
        &self,
        seqs: &mut [PassSeq<'_>],
        obs: &dyn Observer,
        cancel: Option<&AtomicBool>,
        prefill: Option<PrefillStep>,
    ) -> Result<Option<Vec<f32>>> {
        let layers = self.layer_count();
        for s in seqs.iter() {
            self.check_input(s.ids, s.state)?;
            if s.state.layers.len() != layers {
                return Err(Error::Msg(format!(
                    "a state of {} layers for a model of {layers}",
                    s.state.layers.len()
                )));
            }
        }
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
        let mut x = self.embed_rows(&ids)?;
        let first_pos = seqs.first().map_or(0, |s| s.state.pos);
        obs.on(
            0,
            &Event::PassStart {
                first_pos,
                tokens: ids.len(),
            },
        );
        for l in 0..layers {
            if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                return Ok(None);
            }
            let layer = self.layer(l);
            self.attention(l, layer, &mut x, seqs)?;
            self.mlp(l, layer, &mut x, obs)?;
            if let Some(step) = prefill {
                step.report(obs, l, self.bytes_read());
            }
        }
        for s in seqs.iter_mut() {
            s.state.pos += s.ids.len();
        }
        obs.on(layers, &Event::PassEnd);
        Ok(Some(x))
    }

    /// `x += o(attn(rope(q), rope(k), v))` after the input norm: the projections over every
    /// row of the pass, rotation, cache append and attention per sequence.
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
        let (qd, kd) = (s.heads * s.d, s.kv_heads * s.d);
        let scale = 1.0 / (s.d as f32).sqrt();
        let mut a = Vec::with_capacity(t * qd);
        let mut r0 = 0;
        for seq in seqs.iter_mut() {
            let (first, n_rows) = (seq.state.pos, seq.ids.len());
            let LayerState::Rows(cache) = &mut seq.state.layers[l] else {
                return Err(Error::Msg(format!(
                    "layer {l}: the state is not a gpt-oss key/value state"
                )));
            };
            // q, k, v rows r0..r0+n_rows are this sequence's.
            let q = &mut q[r0 * qd..(r0 + n_rows) * qd];
            let mut rows = Vec::with_capacity(n_rows * s.row_width());
            for r in 0..n_rows {
                self.rope().apply(&mut q[r * qd..][..qd], first + r, s.d);
                let mut kr = k[(r0 + r) * kd..][..kd].to_vec();
                self.rope().apply(&mut kr, first + r, s.d);
                rows.extend_from_slice(&kr);
                rows.extend_from_slice(&v[(r0 + r) * kd..][..kd]);
            }
            cache.append(&rows);
            a.extend(attend(&s, q, cache.rows(), first, &layer.sinks, scale));
            r0 += n_rows;
        }
        let o = self.linear(&layer.o, &a, t)?;
        x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
        Ok(())
    }
}
