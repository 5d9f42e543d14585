//! The model families, each in its own folder, and the one list of them (`FAMILIES`). A family
//! implements `runtime::family::ModelFamily` in its folder; the engine, the installer and the
//! front ends find the family of a checkpoint here, by config.json's `model_type`, and never
//! name one. Adding a family is its folder plus one line in `FAMILIES`.

use std::path::Path;

use crate::runtime::family::{self, ModelFamily};
use crate::Result;

pub mod gpt_oss;
pub mod k3;
pub mod qwen3_moe;

/// Every family this build runs.
pub static FAMILIES: &[&'static dyn ModelFamily] = &[
    &k3::family::K3,
    &gpt_oss::family::GptOss,
    &qwen3_moe::family::Qwen3Moe,
];

/// The family of the checkpoint in `root`, from its config.json's `model_type`; an error naming
/// the value and the known families when none runs it.
pub fn family(root: &Path) -> Result<&'static dyn ModelFamily> {
    let t = family::read_model_type(root)?;
    family::find(FAMILIES, t.as_deref(), &root.join("config.json"))
}
