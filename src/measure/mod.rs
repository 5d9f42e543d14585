//! Bounds measured in the same run as the figure they bound, shared by the benchmarks of the
//! `deltafin` binary and of a family's own tools: sample statistics, memory read bandwidth,
//! raw storage read rates and cold-page-cache runs. Owns measurement only; names no family and
//! never changes what a model computes.

pub mod disk;
pub mod forward;
pub mod memory;
mod stats;

pub use stats::Stats;
