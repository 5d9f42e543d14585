//! `ModelOptions`: the evaluation choices of `K3Model`, each with a reference path the tests
//! compare against, and the sizes that bound prefill memory.

use super::kda::KdaMode;
use super::mla::MlaMode;
use crate::mxfp4::Kernel;

/// Evaluation choices; every one has a reference the tests compare against.
#[derive(Debug, Clone, Copy)]
pub struct ModelOptions {
    /// KDA recurrence form for multi-position calls.
    pub kda: KdaMode,
    /// MLA form.
    pub mla: MlaMode,
    /// MXFP4 kernel.
    pub kernel: Kernel,
    /// Rows each op of a prefill runs on at once (bounds the activations).
    pub prefill_chunk: usize,
    /// Most positions one layer-major prefill pass holds (the memory plan's cap): every layer
    /// runs on all of them before the next, so each spine layer and each selected expert is
    /// read once per pass. `prefill_chunk` gives the old chunk-major order.
    pub prefill_pass: usize,
    /// Most routed experts one MoE layer holds at once (a prefill chunk's selection is fetched
    /// and run in groups of this many).
    pub expert_batch: usize,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            kda: KdaMode::Recurrent,
            mla: MlaMode::Compact,
            kernel: Kernel::best(),
            prefill_chunk: 64,
            prefill_pass: 1024,
            expert_batch: 32,
        }
    }
}

impl ModelOptions {
    /// Positions per layer-major pass: `prefill_pass` rounded down to whole chunks (at least
    /// one), so every pass splits into the same chunks as one long pass would.
    pub fn pass_len(&self) -> usize {
        let c = self.prefill_chunk.max(1);
        (self.prefill_pass / c).max(1) * c
    }
}
