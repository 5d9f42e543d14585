//! The contract between the runtime and a model, and what runs around it without knowing which
//! model it is: the `Model` trait and its call types (`model`), the family contract
//! (`family::ModelFamily`) and the load options every family takes (`load`), the observer hook
//! (`observe`), the sequence state and the per-position row cache (`state`, `row_cache`), the
//! decoding loop with its stop rules and speculation (`generate`) and the one memory budget every
//! consumer is charged against (`memory`). The engine, its sessions, the batch scheduler and the
//! prompt cache, which open a model by its family, are `crate::engine`. Names no family.

pub mod family;
pub mod fixtures;
pub mod generate;
pub mod load;
pub mod memory;
pub mod model;
pub mod observe;
pub mod observers;
pub mod rollback;
pub mod row_cache;
pub mod state;
