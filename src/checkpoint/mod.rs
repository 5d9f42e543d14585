//! A checkpoint on disk, whatever its family: safetensors headers, the tensor inventory, expert
//! spans (names and layouts as values), shard identities and the deterministic generator the
//! fixture writers draw from.

mod dense_names;
pub mod experts;
pub mod files;
pub mod fixture_writer;
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
