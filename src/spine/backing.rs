//! Where the spine's bytes come from: the converted store (one file per layer, read or, for a
//! budget below one layer, mapped) or the checkpoint shards (each tensor read in place into one
//! pooled buffer), the layer and largest-tensor sizes the memory plan charges, and the fallback
//! rule for pinning by bytes.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::convert::{
    global_names, is_small, layer_names, store_dir, store_state, SpineFormat, StoreState,
};
use super::layer::{parse_header, read_file_direct, read_file_sized, Entry, LayerData};
use super::source::{Spine, SpineChoice};
use super::ShardSpine;
use crate::checkpoint::Inventory;
use crate::fsio::BufPool;
use crate::{Error, Result};

pub(super) enum Backing {
    Shards(ShardSpine),
    Files(PathBuf),
}

pub(super) struct Inner {
    pub(super) backing: Backing,
    pub(super) inv: Arc<Inventory>,
    pub(super) format: SpineFormat,
    pub(super) pool: Arc<BufPool>,
    /// Streamed layers (store files or shard gathers) are read with parallel `O_DIRECT` requests.
    pub(super) direct: std::sync::atomic::AtomicBool,
    /// The host arithmetic every layer's matrices are handed out with.
    pub(super) kernel: crate::kernels::dense::DenseKernel,
    /// Streamed store layers are mapped for the pass (`SpineOptions::mapped`), not read.
    pub(super) mapped: bool,
    /// The read-ahead of mapped layers (when `mapped`).
    pub(super) ahead: Option<Arc<super::ahead::Readahead>>,
}

impl Inner {
    pub(super) fn layer_path(&self, l: usize) -> PathBuf {
        match &self.backing {
            Backing::Files(d) => d.join(format!("layer-{l:03}.bin")),
            Backing::Shards(_) => PathBuf::new(),
        }
    }

    /// Layer `l` to keep for the whole run: a store file is mapped (shared with the page cache,
    /// faster than reading it into a buffer, measured), the shards are gathered.
    pub(super) fn load_pinned(&self, l: usize) -> Result<LayerData> {
        match &self.backing {
            Backing::Files(_) => super::layer::map_file(&self.layer_path(l)),
            Backing::Shards(_) => self.load(l, &BufPool::new(0), 0),
        }
    }

    /// Layer `l` for one pass: mapped (`mapped`), or in a buffer from `pool` of at least `cap`
    /// bytes.
    pub(super) fn load(&self, l: usize, pool: &Arc<BufPool>, cap: usize) -> Result<LayerData> {
        match &self.backing {
            Backing::Files(_) if self.mapped => {
                let path = self.layer_path(l);
                let mut d = super::layer::map_file_streaming(&path)?;
                d.ahead = (self.ahead.as_ref())
                    .and_then(|ra| ra.attach(l, &path, &d.entries))
                    .map(Box::new);
                Ok(d)
            }
            Backing::Files(_) if self.direct.load(std::sync::atomic::Ordering::Relaxed) => {
                read_file_direct(&self.layer_path(l), pool, cap)
            }
            Backing::Files(_) => read_file_sized(&self.layer_path(l), pool, cap),
            Backing::Shards(s) => pack_from_shards(
                s,
                &layer_names(&self.inv, l),
                &self.inv.layer_name(l, ""),
                |_| true,
                pool,
                cap,
                self.direct.load(std::sync::atomic::Ordering::Relaxed),
            ),
        }
    }
}

/// The tensors `names` (stripped of `strip`) that `keep` accepts, gathered from the shards
/// (`direct`: with parallel `O_DIRECT` reads).
pub(super) fn pack_from_shards(
    s: &ShardSpine,
    names: &[String],
    strip: &str,
    keep: impl Fn(&[usize]) -> bool,
    pool: &Arc<BufPool>,
    cap: usize,
    direct: bool,
) -> Result<LayerData> {
    let pieces = super::gather::pieces(s, names, strip, keep)?;
    super::gather::gather(s, &pieces, pool, cap, direct)
}

/// Reads only the small tensors of a spine file (header, then one positioned read each).
pub(super) fn small_from_file(path: &Path) -> Result<LayerData> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let entries = header_entries(path)?;
    let mut tensors = Vec::new();
    for e in entries.iter().filter(|e| is_small(&e.shape)) {
        let mut b = vec![0u8; e.len];
        f.read_exact_at(&mut b, e.offset as u64)
            .map_err(|e2| Error::io(path, e2))?;
        let dtype = e.dtype;
        tensors.push((e.name.clone(), dtype, e.shape.clone(), b));
    }
    Ok(LayerData::pack(tensors))
}

/// A spine file's tensor entries, from its header alone.
fn header_entries(path: &Path) -> Result<Vec<Entry>> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let mut head = vec![0u8; 16];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| Error::io(path, e))?;
    let n = u64::from_le_bytes(
        head[8..16]
            .try_into()
            .map_err(|_| Error::Msg("short header".into()))?,
    ) as usize;
    if n > len {
        return Err(Error::Msg(format!(
            "{}: header of {n} bytes in a file of {len}; convert the spine again",
            path.display()
        )));
    }
    let mut full = vec![0u8; 16 + n];
    f.read_exact_at(&mut full, 0)
        .map_err(|e| Error::io(path, e))?;
    parse_header(&full, len, path)
}

/// Which layers to pin: as many whole layers as fit in `budget`, in layer order.
pub fn choose_pinned(layer_bytes: &[u64], budget: u64) -> Vec<bool> {
    let mut used = 0u64;
    layer_bytes
        .iter()
        .map(|&b| {
            if used + b <= budget {
                used += b;
                true
            } else {
                false
            }
        })
        .collect()
}

impl Spine {
    /// Where the spine comes from (converted store or shards) for `choice`.
    pub(super) fn backing(
        root: &Path,
        inv: &Arc<Inventory>,
        num_layers: usize,
        choice: SpineChoice,
    ) -> Result<(Backing, SpineFormat)> {
        let fp = crate::checkpoint::Source::of(inv).fingerprint();
        let state = |f: SpineFormat| store_state(root, f, num_layers, &fp);
        let shards_local = inv.shards.iter().all(|s| inv.dir.join(&s.file).is_file());
        let stale = |f: SpineFormat, st: &StoreState| {
            let StoreState::Stale { stale, built_from } = st else {
                return None;
            };
            Some(format!(
                "the {} spine store in {} was built from another checkpoint ({stale} file(s) from source {}; this checkpoint is {fp}): {}",
                f.dir_name(),
                store_dir(root, f).display(),
                built_from.as_deref().unwrap_or("unrecorded"),
                match f {
                    SpineFormat::Int8 => format!("run `deltafin convert-spine-int8 --model-root {}` to rebuild it", root.display()),
                    SpineFormat::Bf16 if shards_local => format!("run `deltafin convert-spine --model-root {}` to rebuild it", root.display()),
                    SpineFormat::Bf16 => "re-run `deltafin setup` to rebuild it".to_string(),
                }
            ))
        };
        let (int8, bf16) = (state(SpineFormat::Int8), state(SpineFormat::Bf16));
        let files = |f| (Backing::Files(store_dir(root, f)), f);
        if choice == SpineChoice::Int8 {
            return match &int8 {
                StoreState::Current => Ok(files(SpineFormat::Int8)),
                st => Err(Error::Msg(stale(SpineFormat::Int8, st).unwrap_or_else(|| {
                    format!(
                        "no complete row-int8 spine in {}: run `deltafin convert-spine-int8 --model-root {}` first",
                        store_dir(root, SpineFormat::Int8).display(),
                        root.display()
                    )
                }))),
            };
        }
        if choice == SpineChoice::Auto && int8 == StoreState::Current {
            return Ok(files(SpineFormat::Int8));
        }
        if bf16 == StoreState::Current {
            return Ok(files(SpineFormat::Bf16));
        }
        // Never a store from another checkpoint: say so, and read the shards when they are here.
        for (f, st) in [(SpineFormat::Int8, &int8), (SpineFormat::Bf16, &bf16)] {
            if let Some(msg) = stale(f, st) {
                if !shards_local {
                    return Err(Error::Msg(msg));
                }
                tracing::warn!("{msg}; reading the spine from the shards meanwhile");
            }
        }
        Ok((
            Backing::Shards(ShardSpine::new(inv.clone())),
            SpineFormat::Bf16,
        ))
    }

    pub(super) fn layer_sizes(backing: &Backing, inv: &Inventory, num_layers: usize) -> Vec<u64> {
        (0..num_layers)
            .map(|l| match backing {
                Backing::Files(d) => std::fs::metadata(d.join(format!("layer-{l:03}.bin")))
                    .map(|m| m.len())
                    .unwrap_or(0),
                // As `gather` lays them out, so a template buffer fits any layer.
                Backing::Shards(s) => super::gather::pieces(s, &layer_names(inv, l), "", |_| true)
                    .map(|p| super::gather::layout(&p).1 as u64)
                    .unwrap_or(0),
            })
            .collect()
    }

    /// What the memory plan needs before anything is read: each layer's bytes and the tail's
    /// (lm_head included) for the spine `choice` would open.
    pub fn sizes(
        root: &Path,
        inv: &Arc<Inventory>,
        num_layers: usize,
        choice: SpineChoice,
    ) -> Result<(Vec<u64>, u64)> {
        let (backing, _) = Self::backing(root, inv, num_layers, choice)?;
        let global = match &backing {
            Backing::Files(d) => std::fs::metadata(d.join("global.bin"))
                .map(|m| m.len())
                .unwrap_or(0),
            // As `gather` lays them out (up to 4 KiB per tensor above their raw lengths).
            Backing::Shards(s) => super::gather::pieces(s, &global_names(inv), "", |_| true)
                .map(|p| super::gather::layout(&p).1 as u64)
                .unwrap_or(0),
        };
        Ok((Self::layer_sizes(&backing, inv, num_layers), global))
    }

    /// The largest tensor of any layer when the spine `choice` picks comes from store files
    /// (which a tight memory plan may map instead of read: `SpineOptions::mapped`); `None`
    /// when it is gathered from the shards.
    pub fn largest_store_tensor(
        root: &Path,
        inv: &Arc<Inventory>,
        num_layers: usize,
        choice: SpineChoice,
    ) -> Result<Option<u64>> {
        let (Backing::Files(d), _) = Self::backing(root, inv, num_layers, choice)? else {
            return Ok(None);
        };
        let mut largest = 0u64;
        for l in 0..num_layers {
            let path = d.join(format!("layer-{l:03}.bin"));
            for e in header_entries(&path)? {
                largest = largest.max(e.len as u64);
            }
        }
        Ok(Some(largest))
    }
}
