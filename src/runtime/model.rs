//! `Model`: what the runtime asks of a model. The engine, the session, the generator, the
//! batch scheduler, the prompt cache and the server hold a `dyn Model` and call only this; a
//! model family (`models::k3`, `models::gpt_oss`, or a Candle user's own) implements it over
//! the shared stores. Owns the contract, no model and no math. The call types are here
//! (`Forward`, `Logits`, `Output`, `BatchItem`); the state, the observer hook and the verify
//! record are the runtime's (`state`, `observe`, `rollback`). Names no family.

use std::sync::Arc;

use candle::{Device, Tensor};

use crate::runtime::observe::Observer;
use crate::runtime::rollback::Rollback;
use crate::runtime::state::SeqState;

use crate::chat::ChatFormat;
use crate::experts::{ExpertProvider, ExpertStats};
use crate::runtime::memory::MemoryPlan;
use crate::spine::report::SpineReport;
use crate::Result;

/// Which logits a forward call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Logits {
    /// The last position's `[V]`.
    #[default]
    Last,
    /// Every position's `[T, V]`.
    All,
}

/// How one `Model::run` call runs besides its math.
#[derive(Default, Clone, Copy)]
pub struct Forward<'a> {
    /// Watches this call only (with the model's own observers).
    pub observer: Option<&'a dyn Observer>,
    /// Checked between layers; when set, the call returns `None` and rewinds the state.
    pub cancel: Option<&'a std::sync::atomic::AtomicBool>,
    /// Which logits to return (`undo` always returns every position's).
    pub logits: Logits,
    /// Keep the record that rewinds the call to any prefix (a verify pass: one pass, no
    /// cancel).
    pub undo: bool,
}

/// What `Model::run` returns.
pub struct Output {
    /// `[V]` (`Logits::Last`) or `[T, V]`.
    pub logits: Tensor,
    /// With `Forward::undo`: the record `Rollback::keep` uses.
    pub rollback: Option<Rollback>,
}

/// One sequence's part of a batched pass.
pub struct BatchItem<'a> {
    /// The positions to consume (at most `ModelOptions::pass_len`).
    pub ids: &'a [u32],
    /// The sequence's state.
    pub state: &'a mut SeqState,
    /// Which logits to return (`undo` always returns every position's).
    pub logits: Logits,
    /// Keep the record that rewinds these rows to any prefix (a verify pass).
    pub undo: bool,
}

/// Checks every item of a batch with `check` (the model's input rules) and refuses one longer
/// than a pass (`most` positions).
pub fn check_batch(
    items: &[BatchItem<'_>],
    most: usize,
    check: impl Fn(&[u32], &SeqState) -> crate::Result<()>,
) -> crate::Result<()> {
    for it in items {
        check(it.ids, it.state)?;
        if it.ids.len() > most {
            return Err(crate::Error::Msg(format!(
                "a batched item holds {} positions; a pass holds at most {most}",
                it.ids.len()
            )));
        }
    }
    Ok(())
}

/// A causal language model the runtime can drive. The first group is what every model must
/// do; the rest are abilities with a default a family overrides when it has them (a batched
/// pass that shares weight reads, verify passes, a memory plan, read counters, a streamed spine).
pub trait Model: Send + Sync {
    /// A fresh, empty sequence state.
    fn new_state(&self) -> SeqState;

    /// The one forward entry: consumes `ids` into `state` as `f` says (which logits, an
    /// observer, a cancel flag, an undo record) and returns the logits, or `None` when `cancel`
    /// was set (the state then returned to where it was).
    fn run(&self, ids: &[u32], state: &mut SeqState, f: &Forward<'_>) -> Result<Option<Output>>;

    /// Refuses what `run` would refuse (no ids, ids past the vocabulary, growth past the
    /// context limit) without touching the state.
    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()>;

    /// Most positions a sequence may hold.
    fn context_limit(&self) -> usize;

    /// Lowers (or, up to the config's maximum, raises) the context limit.
    fn set_context_limit(&mut self, n: usize);

    /// The vocabulary size (the logits' width).
    fn vocab_size(&self) -> usize;

    /// The ids that end a reply.
    fn stop_ids(&self) -> Vec<u32>;

    /// The chat format the model was trained on.
    fn chat_format(&self) -> &'static dyn ChatFormat;

    /// Adds an observer to every pass.
    fn observe(&mut self, o: Arc<dyn Observer>);

    /// Removes every observer.
    fn clear_observers(&mut self);

    /// The device the model computes on.
    fn device(&self) -> &Device;

    /// One pass over the rows of several sequences; each item's logits are bit-identical to
    /// `run` on that item alone. The default runs the items one after another; a model that
    /// shares weight and expert reads across the batch overrides it.
    fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        let mut out = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            let f = Forward {
                observer,
                logits: it.logits,
                undo: it.undo,
                ..Default::default()
            };
            let o = self
                .run(it.ids, it.state, &f)?
                .ok_or_else(|| crate::Error::Msg("a batched pass was cancelled".into()))?;
            out.push(o);
        }
        Ok(out)
    }

    /// Most positions of one sequence in one batched pass.
    fn pass_len(&self) -> usize {
        self.context_limit()
    }

    /// Whether verify passes (`Forward::undo`) are row-independent here, so speculative
    /// decoding may use them. Default: no.
    fn can_verify(&self) -> bool {
        false
    }

    /// Keeps the first `rows` positions of a verify pass (`Forward::undo`). A model that
    /// tells its observers (`Event::Kept`) overrides it.
    fn keep(&self, rb: Rollback, state: &mut SeqState, rows: usize) -> Result<()> {
        rb.keep(state, rows)
    }

    /// The memory plan the model was opened under, if any.
    fn plan(&self) -> Option<&MemoryPlan> {
        None
    }

    /// Bytes of dense (spine) weights read from storage so far.
    fn dense_bytes_read(&self) -> u64 {
        0
    }

    /// Where experts came from so far, when the provider counts it.
    fn expert_stats(&self) -> Option<ExpertStats> {
        None
    }

    /// The routed-expert store, for tools that watch it (layer profile, prefetch reports).
    fn experts(&self) -> Option<&Arc<dyn ExpertProvider>> {
        None
    }

    /// Routed experts chosen per token and available per MoE layer `(top_k, experts)`, for
    /// reports that compare with random routing.
    fn routing(&self) -> Option<(usize, usize)> {
        None
    }

    /// The spine's layout (pinned and streamed layers, bytes one pass reads from storage);
    /// `None` when the dense weights are mapped as they are (nothing re-read per pass).
    fn spine_report(&self) -> Option<SpineReport> {
        None
    }

    /// How the model runs, for reports: its device, kernels and dense-weight layout.
    fn describe(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

impl dyn Model + '_ {
    /// `run` for the last position's logits `[V]`.
    pub fn forward(&self, ids: &[u32], state: &mut SeqState) -> Result<Tensor> {
        self.run(ids, state, &Forward::default())?
            .map(|o| o.logits)
            .ok_or_else(|| crate::Error::Msg("forward was cancelled".into()))
    }

    /// `run` for every position's logits `[T, V]`.
    pub fn forward_all(&self, ids: &[u32], state: &mut SeqState) -> Result<Tensor> {
        let f = Forward {
            logits: Logits::All,
            ..Default::default()
        };
        self.run(ids, state, &f)?
            .map(|o| o.logits)
            .ok_or_else(|| crate::Error::Msg("forward was cancelled".into()))
    }

    /// Bytes read from storage so far: dense weights and expert spans (homes, shards, the
    /// disk cache and the hub).
    pub fn bytes_read(&self) -> u64 {
        let e = self
            .expert_stats()
            .map(|s| s.home_bytes + s.disk_bytes + s.shard_bytes + s.hub_bytes)
            .unwrap_or(0);
        self.dense_bytes_read() + e
    }
}
