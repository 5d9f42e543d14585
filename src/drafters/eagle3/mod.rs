//! EAGLE-3 draft heads (docs/drafters.md): the config in either published spelling (`config`)
//! the head over its mapped tensors (`head`): one step over `T` positions with its own
//! key/value rows, logits over the draft vocabulary mapped to target ids through `d2t`; and
//! the head as the decoding loop's drafter over the target's tapped rows (`drafter`).

pub mod config;
pub mod drafter;
pub mod head;
pub mod train;

pub use config::{Eagle3Config, Spelling};
pub use drafter::Eagle3Drafter;
pub use head::{DraftCache, Eagle3Head, HeadInput, StepOutput};
