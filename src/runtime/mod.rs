//! The runtime around a model: the `Engine` and its `Session`s (`engine`), the decoding loop
//! with its stop rules and speculation (`generate`), and the one memory budget every consumer is
//! charged against (`memory`), and the prompt cache (`prompt_cache`: states saved where requests
//! diverge, in RAM and on disk). It calls the model through its forward entry and owns no math;
//! the crate root re-exports the three modules (`deltafin::engine`, `deltafin::generate`,
//! `deltafin::memory`).

pub mod batch;
pub mod engine;
pub mod generate;
pub mod memory;
pub mod model;
pub mod observe;
pub mod prompt_cache;
pub mod row_cache;
pub mod state;
