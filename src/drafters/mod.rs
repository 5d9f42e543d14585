//! Drafters that read the target's hidden states: heads published in a checkpoint format of
//! their own that propose tokens from the rows the target's pass reports at named layers
//! (`runtime::observers::HiddenTap`), for a verify pass to check. `eagle3`: one decoder layer
//! over the fused rows of three target layers, one token per step (SpecForge's and vLLM
//! `speculators`' spellings); `dflash`: Qwen3-style layers drafting a whole block in one pass
//! (z-lab's and `speculators`' spellings). `DraftHead` opens either by its config. Owns the
//! heads' formats and math; must not touch a target family's weights or names.

pub mod dflash;
pub mod eagle3;
pub(crate) mod parts;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::runtime::generate::Drafter;
use crate::{Error, Result};

/// The drafter installed beside a model: `root/drafter/` when it holds a `config.json` (the
/// built-in K3-tiny ships one).
pub fn installed(root: &Path) -> Option<PathBuf> {
    let dir = root.join("drafter");
    dir.join("config.json").is_file().then_some(dir)
}

/// A draft head in any layout this crate reads.
#[derive(Clone)]
pub enum DraftHead {
    /// An EAGLE-3 head (one token per step).
    Eagle3(Arc<eagle3::Eagle3Head>),
    /// A DFlash head (one block per pass).
    DFlash(Arc<dflash::DFlashHead>),
}

/// Which layout a parsed `config.json` names: `Ok(true)` for DFlash, `Ok(false)` for EAGLE-3
/// (checked by parsing it), an error naming the file for anything else.
pub fn is_dflash(v: &serde_json::Value, path: &Path) -> Result<bool> {
    if dflash::DFlashConfig::is_dflash(v) {
        dflash::DFlashConfig::from_value(v, path)?;
        return Ok(true);
    }
    eagle3::Eagle3Config::from_value(v, path).map_err(|e| {
        Error::Msg(format!(
            "{e} (deltafin reads EAGLE-3 and DFlash draft heads)"
        ))
    })?;
    Ok(false)
}

impl DraftHead {
    /// Opens the head in `dir`, its layout read from `config.json`.
    pub fn open(dir: &Path) -> Result<Self> {
        let (v, path) = parts::read_config(dir)?;
        Ok(match is_dflash(&v, &path)? {
            true => DraftHead::DFlash(Arc::new(dflash::DFlashHead::open(dir)?)),
            false => DraftHead::Eagle3(Arc::new(eagle3::Eagle3Head::open(dir)?)),
        })
    }

    /// The layout's name for people.
    pub fn kind(&self) -> &'static str {
        match self {
            DraftHead::Eagle3(_) => "EAGLE-3",
            DraftHead::DFlash(_) => "DFlash",
        }
    }

    /// The target vocabulary the head drafts in.
    pub fn vocab(&self) -> usize {
        match self {
            DraftHead::Eagle3(h) => h.config().vocab,
            DraftHead::DFlash(h) => h.config().vocab,
        }
    }

    /// The target layers it reads for a target of `layers` decoder layers.
    pub fn taps(&self, layers: usize) -> Vec<usize> {
        match self {
            DraftHead::Eagle3(h) => h.config().taps(layers),
            DraftHead::DFlash(h) => h.config().tap_layers.clone(),
        }
    }

    /// A fresh drafter for one sequence of a target of `layers` decoder layers.
    pub fn drafter(&self, layers: usize) -> Box<dyn Drafter> {
        match self {
            DraftHead::Eagle3(h) => Box::new(eagle3::Eagle3Drafter::new(h.clone(), layers)),
            DraftHead::DFlash(h) => Box::new(dflash::DFlashDrafter::new(h.clone())),
        }
    }
}
