//! gpt-oss as a row-cache model (`layers::row_model::RowModel`, which makes it the runtime's
//! `Model`): the answers only the family knows. Owns nothing else.

use std::sync::Arc;

use super::GptOssModel;
use crate::chat::ChatFormat;
use crate::experts::ExpertProvider;
use crate::layers::row_model::RowModel;
use crate::runtime::memory::MemoryPlan;
use crate::runtime::observe::Observer;
use crate::runtime::state::SeqState;

impl RowModel for GptOssModel {
    fn new_state(&self) -> SeqState {
        GptOssModel::new_state(self)
    }

    fn context_limit(&self) -> usize {
        GptOssModel::context_limit(self)
    }

    fn set_context_limit(&mut self, n: usize) {
        GptOssModel::set_context_limit(self, n)
    }

    fn stop_ids(&self) -> Vec<u32> {
        self.config().eos_ids().unwrap_or_default()
    }

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::Harmony
    }

    fn plan(&self) -> Option<&MemoryPlan> {
        GptOssModel::plan(self)
    }

    fn experts(&self) -> &Arc<dyn ExpertProvider> {
        GptOssModel::experts(self)
    }

    fn routing(&self) -> (usize, usize) {
        let c = self.config();
        (c.top_k(), c.num_local_experts)
    }

    fn observe(&mut self, o: Arc<dyn Observer>) {
        GptOssModel::observe(self, o)
    }

    fn clear_observers(&mut self) {
        GptOssModel::clear_observers(self)
    }
}
