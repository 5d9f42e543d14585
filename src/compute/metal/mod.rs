//! The Metal side of the compute seam: the spine matrices' GEMV reading a layer's device copy
//! (`dense`), one MoE layer's experts in two dispatches (`experts`), and the template layers
//! (`spine`). Built on the shader library in `crate::shaders`; reached only through
//! `compute::{dense, run_experts, spine_device}`.

mod dense;
mod experts;
mod spine;

pub(super) use dense::dense;
pub use experts::run_experts;
pub(super) use spine::SpineDevice;
