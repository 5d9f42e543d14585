//! The installer: `setup` from the hub (full or streaming, with a disk plan; the model's family
//! names its files and builds what it needs from the dense tensors), `fetch-experts` (finish a
//! streaming install), a published drafter beside a model (`drafter`) and the `warm-cache`
//! plan from router traces. What an install leaves on
//! disk and how the engine opens it is `installed`; this module writes it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::checkpoint::inventory::{discover_shards, remote_headers_dir};
use crate::checkpoint::{Dtype, Inventory};
use crate::experts::{CacheAdvice, DiskCache, TieredOptions};
use crate::fsio::atomic::write_atomic;
use crate::hub::HubRepo;
use crate::spine::convert::TensorBytes;
use crate::{Error, Result};

mod download;
mod drafter;
pub mod homes;
mod layers;
mod setup;
use crate::fsio::{free_bytes, RootLock};
pub use download::part_name;
pub use drafter::install_drafter;
pub use layers::parse_layers;
pub use setup::setup;

use crate::installed::{
    adopt_source, experts_dir, manifest_path, read_manifest, setup_marker, Manifest, Mode,
};

/// `setup` settings.
#[derive(Debug, Clone)]
pub struct SetupOptions {
    /// `owner/name`.
    pub repo: String,
    /// Revision (default main).
    pub revision: Option<String>,
    /// Install directory.
    pub root: PathBuf,
    /// Forced mode (`None`: full when the disk has room, else stream).
    pub mode: Option<Mode>,
    /// Plan only.
    pub dry_run: bool,
}

/// The disk plan.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Plan {
    /// Chosen mode.
    pub mode: Mode,
    /// Bytes a full install needs (shards + spine store + margin).
    pub full_bytes: u64,
    /// Bytes a streaming install needs now (spine store + metadata + margin).
    pub stream_bytes: u64,
    /// Free bytes on the install's filesystem.
    pub free_bytes: u64,
    /// Bytes of all routed experts (what finishing a streaming install downloads).
    pub expert_bytes: u64,
}

/// Tensor bytes fetched by range from the hub.
pub struct RemoteTensors<'a> {
    hub: &'a HubRepo,
    inv: &'a Inventory,
}

impl TensorBytes for RemoteTensors<'_> {
    fn tensor_bytes(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)> {
        let t = self.inv.get(name).ok_or_else(|| Error::Tensor {
            name: name.into(),
            msg: "not in the inventory".into(),
        })?;
        let b = if t.is_empty() {
            Vec::new()
        } else {
            self.hub
                .fetch_range(&self.inv.shards[t.shard].file, t.start..t.end)?
        };
        Ok((b, t.dtype, t.shape.clone()))
    }
}

/// Decoder layers of the checkpoint in `root` (the expert index's, whatever the family).
pub fn layer_count(root: &Path) -> Result<usize> {
    let inv = Inventory::from_dir(root)?;
    Ok(crate::models::family(root)?
        .expert_index(root, &inv)?
        .spans
        .len())
}

/// Experts of the chosen MoE layers not yet in a streaming install's cache: `(layer, ids, bytes)`.
pub fn missing_experts(
    root: &Path,
    layers: Option<&[usize]>,
) -> Result<Vec<(usize, Vec<usize>, u64)>> {
    let inv = Inventory::from_dir(root)?;
    let index = crate::models::family(root)?.expert_index(root, &inv)?;
    let dir = experts_dir(root);
    let mut out = Vec::new();
    // The MoE layers: those with routed experts.
    for l in (0..index.spans.len()).filter(|&l| !index.spans[l].is_empty()) {
        if layers.is_some_and(|ls| !ls.contains(&l)) {
            continue;
        }
        let mut ids = Vec::new();
        let mut bytes = 0;
        for (e, s) in index.spans[l].iter().enumerate() {
            let have = std::fs::metadata(dir.join(format!("L{l}-E{e}.bin")))
                .map(|m| m.len())
                .ok()
                == Some(s.len());
            if !have {
                ids.push(e);
                bytes += s.len();
            }
        }
        out.push((l, ids, bytes));
    }
    Ok(out)
}

/// Fetches the given experts of a streaming install into its cache (resumable: cached experts
/// are skipped).
pub fn fetch_experts(root: &Path, todo: &[(usize, Vec<usize>, u64)]) -> Result<()> {
    let _lock = RootLock::acquire(root)?;
    let m = read_manifest(root).ok_or_else(|| {
        Error::Msg(format!(
            "{} is not a streaming install (run `deltafin setup --stream` first)",
            root.display()
        ))
    })?;
    if m.mode != Mode::Stream {
        return Err(Error::Msg(
            "this install is full: every expert is already local".into(),
        ));
    }
    let inv = Arc::new(Inventory::from_dir(root)?);
    let index = Arc::new(crate::models::family(root)?.expert_index(root, &inv)?);
    let opts = TieredOptions {
        ram_budget: 0,
        prefetch_previous: false,
        advice: CacheAdvice::Auto,
        ..Default::default()
    };
    let store = crate::installed::expert_store(root, inv, index, &opts, None)?;
    let total: u64 = todo.iter().map(|t| t.2).sum();
    let bar = crate::progress::Bar::bytes(total, "fetching experts");
    for (l, ids, bytes) in todo {
        for chunk in ids.chunks(16) {
            store.warm_disk_cache(*l, chunk)?;
        }
        bar.inc(*bytes);
    }
    bar.finish_and_clear();
    Ok(())
}

/// Selection counts per `(layer, expert)` from router traces (`router_trace.jsonl`).
pub fn count_selections(traces: &[PathBuf]) -> Result<HashMap<(usize, usize), u64>> {
    let mut counts = HashMap::new();
    for p in traces {
        let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: serde_json::Value = serde_json::from_str(line)
                .map_err(|e| Error::Msg(format!("{} line {}: {e}", p.display(), n + 1)))?;
            let Some(layers) = v.get("layers").and_then(|l| l.as_object()) else {
                continue;
            };
            for (l, ids) in layers {
                let Ok(l) = l.parse::<usize>() else { continue };
                for e in ids
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.as_u64())
                {
                    *counts.entry((l, e as usize)).or_insert(0) += 1;
                }
            }
        }
    }
    Ok(counts)
}

/// The absent experts ranked by how often the traces selected them (most first; ties by id).
pub fn warm_plan(root: &Path, traces: &[PathBuf]) -> Result<Vec<((usize, usize), u64)>> {
    let counts = count_selections(traces)?;
    let missing: std::collections::HashSet<(usize, usize)> = missing_experts(root, None)?
        .into_iter()
        .flat_map(|(l, ids, _)| ids.into_iter().map(move |e| (l, e)))
        .collect();
    let mut plan: Vec<((usize, usize), u64)> = counts
        .into_iter()
        .filter(|(k, _)| missing.contains(k))
        .collect();
    plan.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Ok(plan)
}
