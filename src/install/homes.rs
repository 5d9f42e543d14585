//! `populate-home`: fills a storage home (a directory on another drive, `experts::homes`) with
//! the hottest experts by router trace, or all of them, and records it in `install.json`. Each
//! expert is published atomically (temporary file, fsync, rename; checksum first), so a crash
//! or Ctrl-C leaves only whole experts, and a rerun copies only what is missing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::count_selections;
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::experts::{CacheAdvice, DiskCache, ExpertProvider, TieredOptions};
use crate::fsio::atomic::write_atomic;
use crate::installed::{adopt_source, expert_store, manifest_path, read_manifest};
use crate::{Error, Result};

/// Which experts a home gets.
#[derive(Debug, Clone)]
pub enum HomeSelection {
    /// The `n` most selected in these router traces (ties by layer, then expert).
    Hottest(usize, Vec<PathBuf>),
    /// Every routed expert.
    All,
    /// These `(layer, expert)` pairs.
    Experts(Vec<(usize, usize)>),
}

/// What `populate_home` did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PopulateReport {
    /// Experts the home holds for this selection now.
    pub experts: usize,
    /// Of those, copied by this run.
    pub copied: usize,
    /// Bytes copied by this run.
    pub bytes: u64,
    /// Whether the home was recorded in `install.json` (only installs have one).
    pub recorded: bool,
}

/// The experts `sel` picks, most selected first (`All`: every routed expert `index` lists).
pub fn selection(index: &ExpertIndex, sel: &HomeSelection) -> Result<Vec<(usize, usize)>> {
    match sel {
        HomeSelection::All => Ok(index
            .spans
            .iter()
            .enumerate()
            .flat_map(|(l, s)| (0..s.len()).map(move |e| (l, e)))
            .collect()),
        HomeSelection::Experts(v) => Ok(v.clone()),
        HomeSelection::Hottest(n, traces) => {
            if traces.is_empty() {
                return Err(Error::Msg(
                    "--hottest needs router traces (--trace router_trace.jsonl, from `run --router-trace`)".into(),
                ));
            }
            let mut ranked: Vec<((usize, usize), u64)> =
                count_selections(traces)?.into_iter().collect();
            ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            Ok(ranked.into_iter().take(*n).map(|(k, _)| k).collect())
        }
    }
}

/// Copies the selected experts of the model in `root` into the home `dir` (created if missing),
/// from wherever the install keeps them (shards, its expert cache, or the hub), and records the
/// home in `install.json` when `root` is an install. Stops cleanly between experts on `cancel`.
pub fn populate_home(
    root: &Path,
    dir: &Path,
    sel: &HomeSelection,
    cancel: &AtomicBool,
    mut progress: impl FnMut(usize, usize),
) -> Result<PopulateReport> {
    let inv = Arc::new(Inventory::from_dir(root)?);
    let index = Arc::new(crate::models::family(root)?.expert_index(root, &inv)?);
    let want = selection(&index, sel)?;
    let home = DiskCache::new(dir, CacheAdvice::Auto)?;
    // Records this checkpoint's identity (and drops experts a different one left here).
    adopt_source(&home, &inv, &index)?;
    let held: std::collections::HashSet<(usize, usize)> =
        home.cached_experts().into_iter().collect();
    let source = expert_store(
        root,
        inv,
        index.clone(),
        &TieredOptions {
            ram_budget: 0,
            prefetch_previous: false,
            ..Default::default()
        },
        None,
    )?;
    let mut report = PopulateReport::default();
    for (i, &(l, e)) in want.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return Err(Error::Msg(format!(
                "populate-home stopped after {} of {} experts (rerun to finish)",
                i,
                want.len()
            )));
        }
        let span = index
            .span(l, e)
            .ok_or_else(|| Error::Msg(format!("layer {l} has no routed expert {e}")))?;
        let fresh = !held.contains(&(l, e))
            || std::fs::metadata(home.path(l, e)).map(|m| m.len()).ok() != Some(span.len());
        if fresh {
            let bytes = source
                .fetch(l, &[e])?
                .pop()
                .ok_or_else(|| Error::Msg(format!("no bytes for expert {e} of layer {l}")))?;
            home.publish(l, e, &bytes)?;
            report.copied += 1;
            report.bytes += bytes.len() as u64;
        }
        progress(i + 1, want.len());
    }
    report.experts = want.len();
    if let Some(mut m) = read_manifest(root) {
        let abs = std::fs::canonicalize(dir).map_err(|e| Error::io(dir, e))?;
        if !m.homes.contains(&abs) {
            m.homes.push(abs);
            let text = serde_json::to_string_pretty(&m).map_err(|e| Error::Msg(e.to_string()))?;
            write_atomic(&manifest_path(root), text.as_bytes())?;
        }
        report.recorded = true;
    }
    Ok(report)
}
