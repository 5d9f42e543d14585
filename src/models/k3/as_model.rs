//! K3 as the runtime's `Model`: each call forwards to `K3Model`'s own entry of the same name.
//! Owns only the mapping; the math stays in `model.rs` and `batch.rs`.

use std::sync::Arc;

use super::{BatchItem, Forward, K3Model, MlaMode, Observer, Output, Rollback, SeqState};
use crate::chat::ChatFormat;
use crate::experts::ExpertStats;
use crate::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::Result;

impl Model for K3Model {
    fn new_state(&self) -> SeqState {
        K3Model::new_state(self)
    }

    fn run(&self, ids: &[u32], state: &mut SeqState, f: &Forward<'_>) -> Result<Option<Output>> {
        K3Model::run(self, ids, state, f)
    }

    fn run_batch(
        &self,
        items: &mut [BatchItem<'_>],
        observer: Option<&dyn Observer>,
    ) -> Result<Vec<Output>> {
        K3Model::run_batch(self, items, observer)
    }

    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()> {
        K3Model::check_input(self, ids, state)
    }

    fn keep(&self, rb: Rollback, state: &mut SeqState, rows: usize) -> Result<()> {
        K3Model::keep(self, rb, state, rows)
    }

    fn can_verify(&self) -> bool {
        // Expanded MLA (the reference form) is not row-independent.
        self.options.mla == MlaMode::Compact
    }

    fn context_limit(&self) -> usize {
        K3Model::context_limit(self)
    }

    fn set_context_limit(&mut self, n: usize) {
        K3Model::set_context_limit(self, n)
    }

    fn vocab_size(&self) -> usize {
        self.config().text().vocab_size
    }

    fn stop_ids(&self) -> Vec<u32> {
        vec![self.config().eos_token_id]
    }

    fn chat_format(&self) -> ChatFormat {
        ChatFormat::Xtml
    }

    fn pass_len(&self) -> usize {
        self.options.pass_len()
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        K3Model::plan(self)
    }

    fn dense_bytes_read(&self) -> u64 {
        self.spine().bytes_read()
    }

    fn expert_stats(&self) -> Option<ExpertStats> {
        K3Model::expert_stats(self)
    }

    fn observe(&mut self, o: Arc<dyn Observer>) {
        K3Model::observe(self, o)
    }

    fn clear_observers(&mut self) {
        K3Model::clear_observers(self)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
