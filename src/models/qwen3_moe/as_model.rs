//! Qwen3-MoE as a row-cache model (`layers::row_model::RowModel`, which makes it the runtime's
//! `Model`): the answers only the family knows. Owns nothing else.

use std::sync::Arc;

use super::Qwen3MoeModel;
use crate::chat::ChatFormat;
use crate::experts::ExpertProvider;
use crate::layers::row_model::RowModel;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::observe::Observer;
use crate::runtime::state::SeqState;

impl RowModel for Qwen3MoeModel {
    fn new_state(&self) -> SeqState {
        Qwen3MoeModel::new_state(self)
    }

    fn context_limit(&self) -> usize {
        Qwen3MoeModel::context_limit(self)
    }

    fn set_context_limit(&mut self, n: usize) {
        Qwen3MoeModel::set_context_limit(self, n)
    }

    fn stop_ids(&self) -> Vec<u32> {
        self.config().eos_ids().unwrap_or_default()
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::ChatMl
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        Qwen3MoeModel::plan(self)
    }

    fn experts(&self) -> &Arc<dyn ExpertProvider> {
        Qwen3MoeModel::experts(self)
    }

    fn routing(&self) -> (usize, usize) {
        let c = self.config();
        (c.num_experts_per_tok, c.num_experts)
    }

    fn observe(&mut self, o: Arc<dyn Observer>) {
        Qwen3MoeModel::observe(self, o)
    }

    fn clear_observers(&mut self) {
        Qwen3MoeModel::clear_observers(self)
    }
}
