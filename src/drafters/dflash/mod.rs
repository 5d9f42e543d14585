//! DFlash block drafters and speculators' DSpark (a DFlash head with a sequential logit bias;
//! docs/drafters.md): the config in either published spelling
//! (`config`), the head over its mapped tensors (`head`): the target's fused rows as every
//! draft layer's context keys and values, one non-causal pass over a block of the anchor token
//! and mask tokens giving a draft per slot; and the head as the decoding loop's drafter over
//! the target's tapped rows (`drafter`).

pub mod config;
pub mod drafter;
pub mod head;
mod markov;

pub use config::{DFlashConfig, DFlashSpelling, Markov, MarkovKind};
pub use drafter::DFlashDrafter;
pub use head::{Block, ContextCache, DFlashHead};
