//! The runtime's `Model` for every row-cache family at once: a family implements `RowModel`
//! (its `RowPass` plus the answers only it knows: limits, stop ids, chat format, plan, expert
//! store, routing, observers) and this blanket implementation maps it onto `Model`: running,
//! batching, verifying and keeping rows are `row_pass`'s; the dense weights are mapped and
//! resident on the CPU. Owns the mapping only.

use std::sync::Arc;

use candle::Device;

use super::row_pass::{self, RowPass};
use crate::chat::ChatFormat;
use crate::experts::{ExpertProvider, ExpertStats};
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::{BatchItem, Forward, Model, Output};
use crate::runtime::observe::Observer;
use crate::runtime::rollback::Rollback;
use crate::runtime::state::SeqState;
use crate::Result;

/// The CPU, which every row-cache family runs on (its family refuses another device at open).
static CPU: Device = Device::Cpu;

/// What a row-cache family answers besides its pass.
pub trait RowModel: RowPass {
    /// An empty sequence: one key/value row cache per layer.
    fn new_state(&self) -> SeqState;
    /// Positions a sequence may hold.
    fn context_limit(&self) -> usize;
    /// Lowers (or, up to the trained context, raises) the context limit.
    fn set_context_limit(&mut self, n: usize);
    /// The ids that end a reply.
    fn stop_ids(&self) -> Vec<u32>;
    /// The chat format the model was trained on.
    fn chat_format(&self) -> &'static dyn ChatFormat;
    /// The memory plan it was opened under.
    fn plan(&self) -> Option<&MemoryPlan>;
    /// The expert store.
    fn experts(&self) -> &Arc<dyn ExpertProvider>;
    /// `(experts per token, experts per layer)`.
    fn routing(&self) -> (usize, usize);
    /// Attaches an observer.
    fn observe(&mut self, o: Arc<dyn Observer>);
    /// Removes every observer.
    fn clear_observers(&mut self);
}

impl<T: RowModel> Model for T {
    fn new_state(&self) -> SeqState {
        RowModel::new_state(self)
    }

    fn run(&self, ids: &[u32], state: &mut SeqState, f: &Forward<'_>) -> Result<Option<Output>> {
        row_pass::run(self, ids, state, f)
    }

    fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        row_pass::run_batch(self, items, observer)
    }

    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        RowPass::check_input(self, ids, state)
    }

    fn keep(&self, rb: Rollback, state: &mut SeqState, rows: usize) -> Result<()> {
        row_pass::keep(self, rb, state, rows)
    }

    fn can_verify(&self) -> bool {
        true
    }

    fn context_limit(&self) -> usize {
        RowModel::context_limit(self)
    }

    fn set_context_limit(&mut self, n: usize) {
        RowModel::set_context_limit(self, n)
    }

    fn vocab_size(&self) -> usize {
        RowPass::vocab_size(self)
    }

    fn stop_ids(&self) -> Vec<u32> {
        RowModel::stop_ids(self)
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        RowModel::chat_format(self)
    }

    fn pass_len(&self) -> usize {
        RowPass::pass_len(self)
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        RowModel::plan(self)
    }

    fn expert_stats(&self) -> Option<ExpertStats> {
        RowModel::experts(self).stats()
    }

    fn observe(&mut self, o: Arc<dyn Observer>) {
        RowModel::observe(self, o)
    }

    fn clear_observers(&mut self) {
        RowModel::clear_observers(self)
    }

    fn device(&self) -> &Device {
        &CPU
    }

    fn experts(&self) -> Option<&Arc<dyn ExpertProvider>> {
        Some(RowModel::experts(self))
    }

    fn routing(&self) -> Option<(usize, usize)> {
        Some(RowModel::routing(self))
    }

    fn describe(&self) -> serde_json::Value {
        // Dense weights mapped and resident: the page cache reads them once, no pass re-reads
        // them (`dense_bytes_read` and `streamed_bytes_per_pass` stay 0).
        serde_json::json!({"device": "cpu", "dense": "mapped"})
    }
}
