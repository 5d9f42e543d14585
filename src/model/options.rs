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
    /// Longest run of positions per forward call (bounds prefill memory).
    pub prefill_chunk: usize,
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
            expert_batch: 32,
        }
    }
}
