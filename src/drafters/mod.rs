//! Drafters that read the target's hidden states: heads published in a checkpoint format of
//! their own that propose tokens from the rows the target's pass reports at named layers
//! (`runtime::observers::HiddenTap`), for a verify pass to check. `eagle3`: one decoder layer
//! over the fused rows of three target layers (SpecForge's and vLLM `speculators`' spellings).
//! Owns the heads' formats and math; must not touch a target family's weights or names.

pub mod eagle3;

/// The drafter installed beside a model: `root/drafter/` when it holds a `config.json` (the
/// built-in K3-tiny ships one).
pub fn installed(root: &std::path::Path) -> Option<std::path::PathBuf> {
    let dir = root.join("drafter");
    dir.join("config.json").is_file().then_some(dir)
}
