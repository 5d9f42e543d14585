//! gpt-oss as the runtime's `Model`: `run` feeds positions in plan-sized passes (one pass with
//! an undo record for a verify pass: keeping a prefix truncates the key/value caches), honours
//! a cancel flag between layers (rewinding the state), and returns logits as Candle tensors.
//! `run_batch` is one pass over every item's rows (`pass.rs`: each selected expert and dense
//! matrix read once for the batch; each item bit-identical to alone). Owns the mapping; the
//! math is `model.rs`'s.

use std::sync::Arc;

use candle::{Device, Tensor};

use super::pass::PassSeq;
use super::GptOssModel;
use crate::chat::ChatFormat;
use crate::experts::{ExpertProvider, ExpertStats};
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::{BatchItem, Forward, Logits, Model, Output};
use crate::runtime::observe::{Both, Event, Observer, PrefillStep};
use crate::runtime::rollback::Rollback;
use crate::runtime::state::{LayerState, SeqState};
use crate::{Error, Result};

impl GptOssModel {
    /// One `run` pass: hidden rows of `ids`, or `None` when cancelled (state rewound); with
    /// `step`, each layer is reported as a step of a prefill.
    fn pass(
        &self,
        ids: &[u32],
        state: &mut SeqState,
        f: &Forward<'_>,
        step: Option<PrefillStep>,
    ) -> Result<Option<Vec<f32>>> {
        let mark = f.cancel.map(|_| state.mark());
        let out = match f.observer {
            Some(o) => self.hidden(ids, state, &Both(self.observers(), o), f.cancel, step)?,
            None => self.hidden(ids, state, self.observers(), f.cancel, step)?,
        };
        if out.is_none() {
            if let Some(m) = mark {
                state.rewind(m);
            }
        }
        Ok(out)
    }

    /// One pass over the rows of every item; each item's logits (`[V]` for `Logits::Last`,
    /// `[T, V]` otherwise) and, for an `undo` item, its rollback. Not cancellable.
    fn run_batch_pass(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        crate::runtime::model::check_batch(items, self.pass_len(), |i, s| self.check_input(i, s))?;
        // (position before, cache rows before, rows, whether only the last row is wanted).
        let shape: Vec<_> = items
            .iter()
            .map(|it| {
                let last = !it.undo && it.logits == Logits::Last;
                (it.state.pos, row_lens(it.state), it.ids.len(), last)
            })
            .collect();
        let mut seqs: Vec<PassSeq> = items
            .iter_mut()
            .map(|it| PassSeq {
                ids: it.ids,
                state: &mut *it.state,
            })
            .collect();
        let x = match observer {
            Some(o) => self.hidden_seqs(&mut seqs, &Both(self.observers(), o), None, None)?,
            None => self.hidden_seqs(&mut seqs, self.observers(), None, None)?,
        }
        .ok_or_else(|| Error::Msg("a batched pass was cancelled".into()))?;
        // The wanted rows of every item through one lm_head read.
        let h = self.config().hidden_size;
        let (mut wanted, mut at) = (Vec::new(), 0);
        for &(_, _, n, last) in &shape {
            let rows = &x[at * h..(at + n) * h];
            wanted.extend_from_slice(if last { &rows[(n - 1) * h..] } else { rows });
            at += n;
        }
        let vocab = self.config().vocab_size;
        let mut logits = self.logits(&wanted, wanted.len() / h)?.into_iter();
        let mut out = Vec::with_capacity(shape.len());
        for (it, (pos, lens, n, last)) in items.iter().zip(shape) {
            let take = if last { 1 } else { n };
            let l: Vec<f32> = logits.by_ref().take(take * vocab).collect();
            out.push(Output {
                logits: self.tensor(l, (!last).then_some(n))?,
                rollback: it.undo.then(|| Rollback::row_caches(pos, n, lens)),
            });
        }
        Ok(out)
    }

    fn tensor(&self, v: Vec<f32>, rows: Option<usize>) -> Result<Tensor> {
        let vocab = self.config().vocab_size;
        Ok(match rows {
            None => Tensor::from_vec(v, vocab, &Device::Cpu)?,
            Some(t) => Tensor::from_vec(v, (t, vocab), &Device::Cpu)?,
        })
    }
}

impl Model for GptOssModel {
    fn new_state(&self) -> SeqState {
        GptOssModel::new_state(self)
    }

    fn run(&self, ids: &[u32], state: &mut SeqState, f: &Forward<'_>) -> Result<Option<Output>> {
        self.check_input(ids, state)?;
        let h = self.config().hidden_size;
        if f.undo {
            let (pos, lens) = (state.pos, row_lens(state));
            let Some(x) = self.pass(ids, state, &Forward { cancel: None, ..*f }, None)? else {
                return Err(Error::Msg("verify was cancelled".into()));
            };
            let logits = self.tensor(self.logits(&x, ids.len())?, Some(ids.len()))?;
            return Ok(Some(Output {
                logits,
                rollback: Some(Rollback::row_caches(pos, ids.len(), lens)),
            }));
        }
        let mark = f.cancel.map(|_| state.mark());
        let (mut last, mut all) = (Vec::new(), Vec::new());
        let len = self.pass_len();
        let (passes, read_before) = (ids.len().div_ceil(len), self.bytes_read());
        for (p, piece) in ids.chunks(len).enumerate() {
            // A prefill reports each layer of each pass (progress bars, ETA).
            let step = (ids.len() > 1).then_some(PrefillStep {
                layer: 0,
                layers: self.config().num_hidden_layers,
                pass: p,
                passes,
                pass_first: p * len,
                pass_tokens: piece.len(),
                positions: ids.len(),
                read_before,
                read_now: read_before,
            });
            let Some(x) = self.pass(piece, state, f, step)? else {
                if let Some(m) = mark {
                    state.rewind(m);
                }
                return Ok(None);
            };
            match f.logits {
                Logits::All => all.extend(self.logits(&x, piece.len())?),
                Logits::Last => last = x,
            }
        }
        let logits = match f.logits {
            Logits::All => self.tensor(all, Some(ids.len()))?,
            Logits::Last => self.tensor(self.logits(&last[last.len() - h..], 1)?, None)?,
        };
        Ok(Some(Output {
            logits,
            rollback: None,
        }))
    }

    fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        self.run_batch_pass(items, observer)
    }

    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        GptOssModel::check_input(self, ids, state)
    }

    fn keep(&self, rb: Rollback, state: &mut SeqState, rows: usize) -> Result<()> {
        rb.keep(state, rows)?;
        self.observers().on(0, &Event::Kept { rows });
        Ok(())
    }

    fn can_verify(&self) -> bool {
        true
    }

    fn context_limit(&self) -> usize {
        GptOssModel::context_limit(self)
    }

    fn set_context_limit(&mut self, n: usize) {
        GptOssModel::set_context_limit(self, n)
    }

    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    fn stop_ids(&self) -> Vec<u32> {
        self.config().eos_ids().unwrap_or_default()
    }

    fn chat_format(&self) -> ChatFormat {
        ChatFormat::Harmony
    }

    fn pass_len(&self) -> usize {
        GptOssModel::pass_len(self)
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        GptOssModel::plan(self)
    }

    fn expert_stats(&self) -> Option<ExpertStats> {
        self.experts().stats()
    }

    fn observe(&mut self, o: Arc<dyn Observer>) {
        GptOssModel::observe(self, o)
    }

    fn clear_observers(&mut self) {
        GptOssModel::clear_observers(self)
    }

    fn device(&self) -> &Device {
        // Runs on the CPU only (the family refuses another device at open).
        &self.device
    }

    fn experts(&self) -> Option<&Arc<dyn ExpertProvider>> {
        Some(GptOssModel::experts(self))
    }

    fn routing(&self) -> Option<(usize, usize)> {
        let c = self.config();
        Some((c.top_k(), c.num_local_experts))
    }

    fn describe(&self) -> serde_json::Value {
        // Dense weights mapped and resident: the page cache reads them once, no pass re-reads
        // them (`dense_bytes_read` and `streamed_bytes_per_pass` stay 0).
        serde_json::json!({"device": "cpu", "dense": "mapped"})
    }
}

/// Each layer's cache length.
fn row_lens(state: &SeqState) -> Vec<usize> {
    state
        .layers
        .iter()
        .map(|l| match l {
            LayerState::Rows(c) => c.len(),
            _ => 0,
        })
        .collect()
}
