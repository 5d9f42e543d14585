//! `setup`: the metadata and every shard header (by range request), the disk plan, then the
//! shards (full) or the dense tensors only (stream), the BF16 spine store and the manifest. A dry
//! run stages what it reads outside the model root and writes nothing there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::download::{download_shard, write_hub_shards};
use super::*;
use crate::checkpoint::source::{is_sha256, read_hub_shards, sha256_hex, HubShard};
use crate::runtime::family::ModelFamily;

fn fetch_to(hub: &HubRepo, root: &Path, file: &str, required: bool) -> Result<bool> {
    let got = hub.metadata(file).and_then(|m| {
        let b = if m.size == 0 {
            Vec::new()
        } else {
            hub.fetch_range(file, 0..m.size)?
        };
        // The hub's ETag is the content SHA-256 for LFS files: check it where it is one.
        if is_sha256(&m.etag) && sha256_hex(&b) != m.etag {
            return Err(Error::Msg(format!(
                "{} does not match the hub's SHA-256 {}",
                hub.url(file),
                m.etag
            )));
        }
        Ok(b)
    });
    match got {
        Ok(b) => {
            write_atomic(&root.join(file), &b)?;
            Ok(true)
        }
        Err(e) if required => Err(e),
        Err(_) => Ok(false),
    }
}

/// Runs `setup`: metadata, shard headers, the disk plan, then the shards (full) or nothing more
/// (stream), the BF16 spine store, and the manifest.
pub fn setup(opts: &SetupOptions, mut say: impl FnMut(&str)) -> Result<Plan> {
    if opts.dry_run {
        // A dry run writes nothing under the model root: the metadata and headers it needs for
        // the plan go to a private staging directory that is removed afterwards.
        let stage = Staging::new()?;
        let staged = SetupOptions {
            root: stage.0.clone(),
            dry_run: true,
            ..opts.clone()
        };
        return plan_in(&staged, existing_ancestor(&opts.root), &mut say).map(|(p, ..)| p);
    }
    let root = &opts.root;
    std::fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
    let _lock = RootLock::acquire(root)?;
    // Marks a setup in progress until `install.json` exists (doctor reads it to tell an
    // interrupted setup from a broken checkpoint).
    let started = serde_json::json!({"repo": opts.repo, "revision": opts.revision});
    write_atomic(&setup_marker(root), started.to_string().as_bytes())?;
    // Storage homes (`populate-home`) are not part of what setup installs: they survive it.
    let homes = read_manifest(root).map(|m| m.homes).unwrap_or_default();
    // A re-run replaces the install: until it finishes, the root is an interrupted setup, not
    // the old install with some new files.
    match std::fs::remove_file(manifest_path(root)) {
        Ok(()) => crate::fsio::atomic::sync_parent(&manifest_path(root))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(manifest_path(root), e)),
    }
    let (plan, cfg, shards, sizes, hub) = plan_in(opts, root.clone(), &mut say)?;
    let plan = install(opts, plan, cfg, shards, sizes, hub)?;
    if let Some(mut m) = read_manifest(root).filter(|_| !homes.is_empty()) {
        m.homes = homes;
        let text = serde_json::to_string_pretty(&m).map_err(|e| Error::Msg(e.to_string()))?;
        write_atomic(&manifest_path(root), text.as_bytes())?;
    }
    Ok(plan)
}

/// A temporary directory removed when dropped.
struct Staging(PathBuf);

impl Staging {
    fn new() -> Result<Self> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let d =
            std::env::temp_dir().join(format!("deltafin-dry-run-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&d).map_err(|e| Error::io(&d, e))?;
        Ok(Staging(d))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The nearest directory at or above `p` that exists (where free space is measured).
fn existing_ancestor(p: &Path) -> PathBuf {
    p.ancestors()
        .find(|a| a.is_dir())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

type Planned = (
    Plan,
    &'static dyn ModelFamily,
    Vec<String>,
    BTreeMap<String, HubShard>,
    HubRepo,
);

/// Metadata and shard headers into `opts.root`, then the disk plan against free space at
/// `disk`.
fn plan_in(opts: &SetupOptions, disk: PathBuf, say: &mut impl FnMut(&str)) -> Result<Planned> {
    let root = &opts.root;
    // Pin the install to the commit the revision names now, so a later re-upload of the repo
    // can never feed other bytes into this root's byte ranges.
    let moving = HubRepo::new(&opts.repo, opts.revision.clone(), None)?;
    let commit = moving.commit("config.json")?;
    say(&format!(
        "{} at {} is commit {commit}",
        opts.repo,
        opts.revision.as_deref().unwrap_or("main")
    ));
    let hub = HubRepo::new(&opts.repo, Some(commit), None)?;
    fetch_to(&hub, root, "config.json", true)
        .map_err(|e| Error::Msg(format!("setup: config.json: {e}")))?;
    // The family (config.json's model_type) names the other files it needs.
    let family = crate::models::family(root)?;
    for &(f, required) in family.metadata_files() {
        fetch_to(&hub, root, f, required).map_err(|e| Error::Msg(format!("setup: {f}: {e}")))?;
    }
    let shards = discover_shards(root)?;
    let hdir = remote_headers_dir(root);
    std::fs::create_dir_all(&hdir).map_err(|e| Error::io(&hdir, e))?;
    let mut sizes = serde_json::Map::new();
    let mut metas = BTreeMap::new();
    for s in &shards {
        let m = hub.metadata(s)?;
        let size = m.size;
        metas.insert(
            s.clone(),
            HubShard {
                size,
                etag: m.etag,
                verified: false,
            },
        );
        let head = hub.fetch_range(s, 0..8.min(size))?;
        let hlen = crate::checkpoint::header::parse_header_len(&head, size, Path::new(s))?;
        let bytes = hub.fetch_range(s, 0..8 + hlen)?;
        write_atomic(&hdir.join(s), &bytes)?;
        sizes.insert(s.clone(), size.into());
    }
    write_atomic(
        &hdir.join("sizes.json"),
        serde_json::Value::Object(sizes.clone())
            .to_string()
            .as_bytes(),
    )?;
    let inv = Inventory::from_dir(root)?;
    let index = family.expert_index(root, &inv)?;
    let shard_bytes: u64 = sizes.values().filter_map(|v| v.as_u64()).sum();
    let expert_bytes: u64 = index.spans.iter().flatten().map(|s| s.len()).sum();
    let spine_bytes = shard_bytes - expert_bytes;
    let margin = |b: u64| b / 50 + (64 << 20);
    // A converted copy of the dense tensors beside the shards, when the family makes one.
    let store_copy = family.dense_copy_bytes(spine_bytes);
    let full_bytes = shard_bytes + store_copy + margin(shard_bytes + store_copy);
    let stream_bytes = spine_bytes + margin(spine_bytes);
    let free = free_bytes(&disk);
    let mode = opts.mode.unwrap_or(if free >= full_bytes {
        Mode::Full
    } else {
        Mode::Stream
    });
    let hb = crate::progress::human_bytes;
    say(&format!(
        "disk plan: a full install needs {}, streaming {} now (+ up to {} of experts as they are used); {} free; mode: {:?}",
        hb(full_bytes),
        hb(stream_bytes),
        hb(expert_bytes),
        hb(free),
        mode
    ));
    let plan = Plan {
        mode,
        full_bytes,
        stream_bytes,
        free_bytes: free,
        expert_bytes,
    };
    Ok((plan, family, shards, metas, hub))
}

/// A full install: every shard downloaded (resumed, verified, recorded one by one), then the
/// spine store converted from them.
fn install_full(
    root: &Path,
    family: &dyn ModelFamily,
    shards: &[String],
    metas: &BTreeMap<String, HubShard>,
    hub: &HubRepo,
) -> Result<()> {
    // Keep only the records of shards that are still the hub's; each shard is recorded again
    // once it is in place and verified.
    let mut record: BTreeMap<String, HubShard> = read_hub_shards(root)
        .into_iter()
        .filter(|(f, r)| {
            metas
                .get(f)
                .is_some_and(|m| m.etag == r.etag && m.size == r.size)
        })
        .collect();
    write_hub_shards(root, &record)?;
    let shard_bytes: u64 = metas.values().map(|m| m.size).sum();
    let bar = crate::progress::Bar::bytes(shard_bytes, "downloading shards");
    for s in shards {
        let Some(want) = metas.get(s) else { continue };
        let got = download_shard(hub, root, s, want, record.get(s), &bar)?;
        record.insert(s.clone(), got);
        write_hub_shards(root, &record)?;
    }
    bar.finish_and_clear();
    family.finish_full_install(root)
}

/// A streaming install: no shard is local; the family builds what it opens from the dense
/// tensors' range reads (a spine store, or one dense file the model maps).
fn install_stream(
    root: &Path,
    family: &dyn ModelFamily,
    metas: &BTreeMap<String, HubShard>,
    hub: &HubRepo,
) -> Result<()> {
    // The hub's ETags identify the shards (and the expert bytes fetched).
    write_hub_shards(root, metas)?;
    let inv = Inventory::from_dir(root)?;
    let remote = RemoteTensors { hub, inv: &inv };
    family.install_dense(root, &inv, &remote)?;
    // Experts cached from shards this upload changed are dropped now, not at first use.
    let cache = DiskCache::new(&experts_dir(root), CacheAdvice::Auto)?;
    adopt_source(&cache, &inv, &family.expert_index(root, &inv)?)?;
    Ok(())
}

/// The install itself: the shards (full) or nothing more (stream), the spine store, the
/// manifest.
fn install(
    opts: &SetupOptions,
    plan: Plan,
    family: &dyn ModelFamily,
    shards: Vec<String>,
    metas: BTreeMap<String, HubShard>,
    hub: HubRepo,
) -> Result<Plan> {
    let root = &opts.root;
    let (mode, full_bytes, stream_bytes, free) = (
        plan.mode,
        plan.full_bytes,
        plan.stream_bytes,
        plan.free_bytes,
    );
    let hb = crate::progress::human_bytes;
    let needed = if mode == Mode::Full {
        full_bytes
    } else {
        stream_bytes
    };
    if free < needed {
        return Err(Error::Msg(format!(
            "not enough disk space in {}: {} needed, {} free",
            root.display(),
            hb(needed),
            hb(free)
        )));
    }
    match mode {
        Mode::Full => install_full(root, family, &shards, &metas, &hub)?,
        Mode::Stream => install_stream(root, family, &metas, &hub)?,
    }
    let m = Manifest {
        mode,
        repo: opts.repo.clone(),
        revision: Some(hub.revision().to_string()),
        requested: opts.revision.clone(),
        fingerprint: Some(crate::checkpoint::Source::of(&Inventory::from_dir(root)?).fingerprint()),
        homes: Vec::new(),
    };
    write_atomic(
        &manifest_path(root),
        serde_json::to_string_pretty(&m)
            .map_err(|e| Error::Msg(e.to_string()))?
            .as_bytes(),
    )?;
    Ok(plan)
}
