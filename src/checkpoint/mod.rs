//! The K3 checkpoint on disk: safetensors headers, the tensor inventory, expert spans and the
//! fixture writers.

mod dense_names;
pub mod experts;
pub mod files;
/// K3's fixture writers, under their earlier path (they live in `models::k3::fixture`).
pub use crate::models::k3::fixture;
pub mod header;
pub mod inventory;
pub mod names;
pub mod rng;
pub mod source;
pub mod tiktoken_fixture;

pub use experts::{ExpertIndex, ExpertLayout, ExpertSpan};
pub use files::ShardFiles;
pub use header::{Dtype, DtypeExt, ShardHeader};
pub use inventory::{Inventory, ShardInfo, TensorInfo};
pub use names::DenseNames;
pub use source::Source;
