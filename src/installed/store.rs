//! The expert store an engine runs on: the local shards of a full install, or the disk cache
//! and the hub for a streaming one, with the storage homes `install.json` records. The install
//! tools write what it reads (the manifest, the cache, the homes); this module only opens it.

use std::path::Path;
use std::sync::Arc;

use super::{adopt_source, experts_dir, read_manifest, Mode};
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::experts::{DiskCache, TieredExperts, TieredOptions};
use crate::hub::HubRepo;
use crate::Result;

/// The expert store of an install: local shards for a full install, the disk cache plus the hub
/// for a streaming one.
pub fn expert_store(
    root: &Path,
    inv: Arc<Inventory>,
    index: Arc<ExpertIndex>,
    opts: &TieredOptions,
    cache: Option<DiskCache>,
) -> Result<TieredExperts> {
    let manifest = read_manifest(root);
    let mut opts = opts.clone();
    for h in manifest.iter().flat_map(|m| &m.homes) {
        if !opts.homes.contains(h) {
            opts.homes.push(h.clone());
        }
    }
    // A home filled from another version of the checkpoint drops the experts that changed.
    for h in &opts.homes {
        if h.is_dir() {
            adopt_source(&DiskCache::new(h, opts.advice)?, &inv, &index)?;
        }
    }
    let opts = &opts;
    match manifest {
        Some(m) if m.mode == Mode::Stream => {
            let cache = match cache {
                Some(c) => c,
                None => {
                    let mut c = DiskCache::new(&experts_dir(root), opts.advice)?;
                    c.verify = opts.verify_cache;
                    c
                }
            };
            adopt_source(&cache, &inv, &index)?;
            let hub = Arc::new(HubRepo::new(&m.repo, m.revision.clone(), None)?);
            TieredExperts::new(index, None, Some(cache), opts)?.with_hub(hub, inv)
        }
        _ => {
            if let Some(c) = &cache {
                adopt_source(c, &inv, &index)?;
            }
            TieredExperts::new(index, Some(inv), cache, opts)
        }
    }
}
