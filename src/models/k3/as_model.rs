//! K3 as the runtime's `Model`: each call forwards to `K3Model`'s own entry of the same name.
//! Owns only the mapping; the math stays in `model.rs` and `batch.rs`.

use std::sync::Arc;

use candle::Device;

use super::{K3Model, MlaMode};
use crate::chat::ChatFormat;
use crate::experts::{ExpertProvider, ExpertStats};
use crate::runtime::memory::MemoryPlan;
use crate::runtime::model::Model;
use crate::runtime::model::{BatchItem, Forward, Output};
use crate::runtime::observe::Observer;
use crate::runtime::rollback::Rollback;
use crate::runtime::state::SeqState;
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

    fn chat_format(&self) -> &'static dyn ChatFormat {
        &crate::chat::Xtml
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

    fn device(&self) -> &Device {
        K3Model::device(self)
    }

    fn experts(&self) -> Option<&Arc<dyn ExpertProvider>> {
        Some(K3Model::experts(self))
    }

    fn routing(&self) -> Option<(usize, usize)> {
        let t = self.config().text();
        Some((t.num_experts_per_token, t.num_experts))
    }

    fn spine_report(&self) -> Option<crate::spine::report::SpineReport> {
        Some(self.spine().report())
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "device": crate::compute::device::describe(K3Model::device(self)),
            "kernel": self.options.kernel.effective().name(),
            "dense_kernel": self.spine().kernel().effective().name(),
            "spine": self.spine().report(),
        })
    }
}

impl crate::eval::Scorer for K3Model {
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        (self as &dyn Model).window_logits(ids)
    }
}

impl crate::eval::Scorer for super::train::Net {
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let t = candle::Tensor::from_vec(ids.to_vec(), (1, ids.len()), &self.device())?;
        Ok(self.forward(&t)?.logits.detach().to_vec2()?)
    }
}
