//! What an install leaves in a model root and how the engine opens it: the manifest
//! (`deltafin-meta/install.json`: full or streaming, the hub repo and commit, storage homes), the
//! expert cache directory, tying a cache to the checkpoint's shards (`adopt_source`), and the
//! expert store over all of it (`expert_store`). Every family's loader comes here; the installer
//! (`install`) writes what this module reads. Knows no family and no network beyond handing
//! the store the hub repo the manifest names.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::{ExpertIndex, Inventory};
use crate::experts::DiskCache;
use crate::Result;

pub mod dense;
mod store;

pub use store::expert_store;

/// Where the install manifest lives.
pub fn manifest_path(root: &Path) -> PathBuf {
    root.join("deltafin-meta").join("install.json")
}

/// Written when `setup` starts (repo and requested revision); an install is finished once
/// `install.json` exists too.
pub fn setup_marker(root: &Path) -> PathBuf {
    root.join("deltafin-meta").join("setup.json")
}

/// What `setup` installed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// `full` (shards local) or `stream` (experts fetched on demand into `experts/`).
    pub mode: Mode,
    /// Hub repository.
    pub repo: String,
    /// The commit the install was made from (resolved at setup; every later fetch asks for it).
    pub revision: Option<String>,
    /// The revision asked for at setup (a branch or tag; informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<String>,
    /// The fingerprint of the checkpoint installed (`checkpoint::source`): what the spine store
    /// and the expert cache must have been built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// Storage homes (`populate-home`): directories on other drives holding experts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub homes: Vec<PathBuf>,
}

/// Reads the install manifest, if any.
pub fn read_manifest(root: &Path) -> Option<Manifest> {
    Manifest::parse(&std::fs::read(manifest_path(root)).ok()?)
}

impl Manifest {
    /// Parses `install.json` (`None` if it is not a manifest).
    pub fn parse(bytes: &[u8]) -> Option<Manifest> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The raw-span expert cache directory of an install.
pub fn experts_dir(root: &Path) -> PathBuf {
    root.join("experts")
}

/// Install mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Download every shard.
    Full,
    /// Download metadata and the spine; experts are fetched on demand.
    Stream,
}

/// Ties an expert cache to this checkpoint's shards: cached experts read from a shard whose
/// identity changed since they were cached are removed (they are fetched again).
pub fn adopt_source(cache: &DiskCache, inv: &Inventory, index: &ExpertIndex) -> Result<usize> {
    let ids = crate::checkpoint::Source::of(inv).shard_ids();
    let shard_of: HashMap<&str, usize> = inv
        .shards
        .iter()
        .enumerate()
        .map(|(i, s)| (s.file.as_str(), i))
        .collect();
    cache.adopt_source(&ids, |unit| {
        let Some(&si) = shard_of.get(unit) else {
            return Vec::new();
        };
        index
            .spans
            .iter()
            .enumerate()
            .flat_map(|(l, es)| {
                es.iter()
                    .enumerate()
                    // An expert split across shards is not whole in any one of them.
                    .filter(move |(_, s)| s.shard == si && !s.is_split())
                    .map(move |(e, _)| (l, e))
            })
            .collect()
    })
}
