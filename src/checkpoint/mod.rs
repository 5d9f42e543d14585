//! The K3 checkpoint on disk: safetensors headers, the tensor inventory, expert spans and the
//! fixture writers.

mod dense_names;
pub mod experts;
pub mod files;
pub mod fixture;
pub mod header;
pub mod inventory;
pub mod rng;
pub mod source;
pub mod tiktoken_fixture;

pub use experts::{ExpertIndex, ExpertLayout, ExpertSpan};
pub use files::ShardFiles;
pub use header::{Dtype, DtypeExt, ShardHeader};
pub use inventory::{Inventory, ShardInfo, TensorInfo};
pub use source::Source;
