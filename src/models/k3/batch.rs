//! Batched passes: one `K3Model::run_batch` call consumes rows of several sequences, each with
//! its own state, reading each spine layer once and each distinct selected expert once for all
//! of them. Every op computes a row the same way whatever else is in the pass (dense kernels
//! with a fixed reduction order, per-sequence attention on a fixed position grid, the KDA
//! recurrence per position, the MoE per row), so each sequence's logits are bit-identical to
//! running it alone. Owns the batch's bookkeeping; the math is `run_layers`'.

use candle::Tensor;

use super::model::{K3Model, PassSeq};
use crate::runtime::model::{Logits, Output};
use crate::runtime::observe::{Both, Observer};
use crate::runtime::rollback::Rollback;
use crate::{Error, Result};

use crate::runtime::model::BatchItem;

impl K3Model {
    /// One pass over the rows of every item: returns each item's logits (`[V]` for
    /// `Logits::Last`, `[T, V]` otherwise) and, for an `undo` item, its rollback. Bit-identical
    /// per item to `run` on that item alone. Not cancellable: a pass is one step of a batch.
    pub fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        crate::runtime::model::check_batch(items, self.options.pass_len(), |i, s| {
            self.check_input(i, s)
        })?;
        // (position before, rows, whether only the last row's logits are wanted) per item.
        let shape: Vec<(usize, usize, bool)> = items
            .iter()
            .map(|it| {
                (
                    it.state.pos,
                    it.ids.len(),
                    !it.undo && it.logits == Logits::Last,
                )
            })
            .collect();
        let mut seqs: Vec<PassSeq> = items
            .iter_mut()
            .map(|it| PassSeq {
                ids: it.ids,
                state: &mut *it.state,
                undo: it.undo.then(|| Vec::with_capacity(self.layer_count())),
            })
            .collect();
        let ctl = Default::default();
        let hs = match observer {
            Some(o) => self.run_layers(&mut seqs, &Both(self.observers(), o), ctl)?,
            None => self.run_layers(&mut seqs, self.observers(), ctl)?,
        }
        .ok_or_else(|| Error::Msg("a batched pass was cancelled".into()))?;
        let undos: Vec<Option<Vec<_>>> = seqs.into_iter().map(|s| s.undo).collect();
        // The rows whose logits are wanted, from every item, through one tail: the lm_head is
        // read once for the pass (row-independent like every other dense op).
        let mut rows = Vec::with_capacity(hs.len());
        for (&(_, n, last), h) in shape.iter().zip(&hs) {
            let all = Tensor::cat(h, 0)?; // [T, H]
            rows.push(if last { all.narrow(0, n - 1, 1)? } else { all });
        }
        let logits = self.tail(&Tensor::cat(&rows, 0)?)?; // [R, V]
        let mut at = 0;
        let mut out = Vec::with_capacity(shape.len());
        for ((pos, n, last), undo) in shape.into_iter().zip(undos) {
            let take = if last { 1 } else { n };
            let l = logits.narrow(0, at, take)?;
            at += take;
            let rollback = undo.map(|layers| Rollback {
                pos,
                rows: n,
                layers,
            });
            let logits = if last { l.squeeze(0)? } else { l };
            out.push(Output { logits, rollback });
        }
        Ok(out)
    }
}
