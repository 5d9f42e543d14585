//! Training an EAGLE-3 head for a target on the runtime (`deltafin train-drafter`): the
//! target's own greedy continuations and hidden rows (`data`), the head as an unrolled Candle
//! autograd network (`net`), the loop with checkpoints (`run`), and the export in the published
//! layout the loader (`super::head`) reads (`export`). Family-blind: the target is any `Model`
//! with its tokenizer; the engine is not named here (it depends on `drafters`).

pub mod data;
pub mod export;
pub mod net;
pub mod run;

pub use export::{export, WeightDtype};
pub use net::{HeadDims, HeadNet};
pub use run::{train_drafter, DrafterTrainOptions, DrafterTrainReport, Trained};
