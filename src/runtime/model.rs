//! `Model`: what the runtime asks of a model. The engine, the session, the generator, the
//! batch scheduler, the prompt cache and the server hold a `dyn Model` and call only this; a
//! model family (`models::k3`, `models::gpt_oss`, or a Candle user's own) implements it over
//! the shared stores. Owns the contract, no model and no math. The call and state types it
//! names are here (`Forward`, `Logits`, `Output`, `BatchItem`) or in the runtime (`SeqState`,
//! `Observer`, `RowCache`); K3's layer states (KDA, MLA) and its verify record (`Rollback`,
//! which also keeps a prefix of row caches) still live under `models::k3`.

use std::any::Any;
use std::sync::Arc;

use candle::Tensor;

pub use crate::models::k3::Rollback;
pub use crate::runtime::observe::{Event, Observer};
pub use crate::runtime::state::SeqState;

use crate::chat::ChatFormat;
use crate::experts::ExpertStats;
use crate::memory::MemoryPlan;
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

/// A causal language model the runtime can drive.
pub trait Model: Send + Sync {
    /// A fresh, empty sequence state.
    fn new_state(&self) -> SeqState;

    /// The one forward entry: consumes `ids` into `state` as `f` says (which logits, an
    /// observer, a cancel flag, an undo record) and returns the logits, or `None` when `cancel`
    /// was set (the state then returned to where it was).
    fn run(&self, ids: &[u32], state: &mut SeqState, f: &Forward<'_>) -> Result<Option<Output>>;

    /// One pass over the rows of several sequences; each item's logits are bit-identical to
    /// `run` on that item alone.
    fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>>;

    /// Refuses what `run` would refuse (no ids, ids past the vocabulary, growth past the
    /// context limit) without touching the state.
    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()>;

    /// Keeps the first `rows` positions of a verify pass (`Forward::undo`).
    fn keep(&self, rb: Rollback, state: &mut SeqState, rows: usize) -> Result<()>;

    /// Whether verify passes are row-independent here (speculative decoding allowed).
    fn can_verify(&self) -> bool;

    /// Most positions a sequence may hold.
    fn context_limit(&self) -> usize;

    /// Lowers (or, up to the config's maximum, raises) the context limit.
    fn set_context_limit(&mut self, n: usize);

    /// The vocabulary size (the logits' width).
    fn vocab_size(&self) -> usize;

    /// The ids that end a reply.
    fn stop_ids(&self) -> Vec<u32>;

    /// The chat format the model was trained on.
    fn chat_format(&self) -> ChatFormat;

    /// Most positions of one sequence in one batched pass.
    fn pass_len(&self) -> usize;

    /// The memory plan the model was opened under, if any.
    fn plan(&self) -> Option<&MemoryPlan>;

    /// Bytes of dense (spine) weights read from storage so far.
    fn dense_bytes_read(&self) -> u64;

    /// Where experts came from so far, when the provider counts it.
    fn expert_stats(&self) -> Option<ExpertStats>;

    /// Adds an observer to every pass.
    fn observe(&mut self, o: Arc<dyn Observer>);

    /// Removes every observer.
    fn clear_observers(&mut self);

    /// The concrete model (for tools that need one family's internals).
    fn as_any(&self) -> &dyn Any;

    /// The concrete model, mutable.
    fn as_any_mut(&mut self) -> &mut dyn Any;
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

    /// The model as `T`, when it is one.
    pub fn downcast<T: 'static>(&self) -> Option<&T> {
        self.as_any().downcast_ref::<T>()
    }

    /// The model as a mutable `T`, when it is one.
    pub fn downcast_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.as_any_mut().downcast_mut::<T>()
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
