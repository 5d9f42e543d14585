//! Writing the spine store: one file per layer (`layer-NNN.bin`), the tail (`global.bin`:
//! final norm, output AttnRes, lm_head) and the embedding (`embed.bin`), in BF16 (the original
//! bytes) or row-int8. Resumable: complete files built from the same checkpoint (its
//! fingerprint, `checkpoint::source`) are kept, files from another checkpoint are rebuilt, and
//! each file is written atomically.

use std::path::{Path, PathBuf};

use super::layer::{file_source, is_current, write_file};
use super::{to_f32, ShardSpine};
use crate::checkpoint::{Dtype, Inventory};
use crate::kernels::dense::quantize_row_int8;
use crate::{Error, Result};

/// Spine storage format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpineFormat {
    /// The checkpoint's BF16/F32 bytes, unchanged.
    Bf16,
    /// Row-int8 (spec §5 item 2) for the projection matrices.
    Int8,
}

impl SpineFormat {
    /// Directory name under the store root.
    pub fn dir_name(self) -> &'static str {
        match self {
            SpineFormat::Bf16 => "bf16",
            SpineFormat::Int8 => "int8",
        }
    }
}

/// Whether a tensor is converted to row-int8 under the default (K3's) names; the conversion
/// itself asks the inventory's names (`DenseNames::is_int8_target`).
pub fn is_int8_target(name: &str, dtype: Dtype, shape: &[usize]) -> bool {
    crate::checkpoint::DenseNames::default().is_int8_target(name, dtype, shape)
}

/// Whether a tensor is "small" (kept resident, read once at startup) rather than a streamed
/// matrix: anything that is not a 2-D matrix with both dimensions above 1.
pub fn is_small(shape: &[usize]) -> bool {
    !(shape.len() == 2 && shape[0] > 1 && shape[1] > 1)
}

type Packed = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

/// Where raw tensor bytes come from (local shards, or range requests to the hub).
pub trait TensorBytes {
    /// The bytes, dtype and shape of a tensor.
    fn tensor_bytes(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)>;
}

impl TensorBytes for ShardSpine {
    fn tensor_bytes(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)> {
        self.bytes(name)
    }
}

/// Tensor bytes from a complete BF16 spine store (the original bytes): what a streaming
/// install, which has no shards, converts to row-int8 from. The file last read is kept, so a
/// conversion, which asks for a layer's tensors one after another, reads each file once (not
/// once per tensor: 28 reads of a 1.27 GB layer at K3's shape).
pub struct StoreTensors<'a> {
    dir: PathBuf,
    inv: &'a Inventory,
    fingerprint: String,
    open: std::sync::Mutex<Option<(PathBuf, super::layer::LayerData)>>,
    reads: std::sync::atomic::AtomicUsize,
}

impl<'a> StoreTensors<'a> {
    /// A source over the BF16 store in `dir` of the checkpoint `inv` describes.
    pub fn new(dir: PathBuf, inv: &'a Inventory) -> Self {
        StoreTensors {
            dir,
            inv,
            fingerprint: crate::checkpoint::Source::of(inv).fingerprint(),
            open: std::sync::Mutex::new(None),
            reads: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Store files read so far.
    pub fn files_read(&self) -> usize {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl TensorBytes for StoreTensors<'_> {
    fn tensor_bytes(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)> {
        let rel = name.strip_prefix(&self.inv.prefix).unwrap_or(name);
        let (file, entry) = match rel
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(l, rest)| l.parse::<usize>().ok().map(|l| (l, rest)))
        {
            Some((l, rest)) => (format!("layer-{l:03}.bin"), rest.to_string()),
            None if rel == self.inv.names.embedding => ("embed.bin".into(), rel.to_string()),
            None => ("global.bin".into(), rel.to_string()),
        };
        let path = self.dir.join(&file);
        let mut open = self
            .open
            .lock()
            .map_err(|_| Error::Msg("store reader poisoned".into()))?;
        if open.as_ref().is_none_or(|(p, _)| *p != path) {
            *open = None; // free the previous file before reading the next
            let ld = super::layer::read_file(&path, &crate::fsio::BufPool::new(0))?;
            if ld.source() != Some(self.fingerprint.as_str()) {
                return Err(Error::Msg(format!(
                    "{} was built from another checkpoint (source {}, the checkpoint is {}): re-run `deltafin setup` to rebuild the BF16 store first",
                    path.display(),
                    ld.source().unwrap_or("unrecorded"),
                    self.fingerprint
                )));
            }
            self.reads
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            *open = Some((path.clone(), ld));
        }
        let (_, ld) = open
            .as_ref()
            .ok_or_else(|| Error::Msg("store reader lost its file".into()))?;
        ld.raw_tensor(&entry)
            .map_err(|e| Error::Msg(format!("{}: {e}", path.display())))
    }
}

/// The tensors of one group, converted to `format` (row-int8 where `model` says so); `strip` is
/// removed from each name.
pub fn convert_group(
    spine: &dyn TensorBytes,
    names: &[String],
    strip: &str,
    (format, model): (SpineFormat, &crate::checkpoint::DenseNames),
) -> Result<Packed> {
    let mut out = Vec::new();
    for full in names {
        let (bytes, dtype, shape) = spine.tensor_bytes(full)?;
        let name = full.strip_prefix(strip).unwrap_or(full).to_string();
        if format == SpineFormat::Int8 && model.is_int8_target(full, dtype, &shape) {
            let w = to_f32(&bytes, dtype, full)?;
            let (rows, cols) = (shape[0], shape[1]);
            let mut q = Vec::with_capacity(rows * cols);
            let mut sc = Vec::with_capacity(2 * rows);
            for r in 0..rows {
                let (qq, s) = quantize_row_int8(&w[r * cols..(r + 1) * cols]);
                q.extend(qq.iter().map(|v| *v as u8));
                sc.extend(s.to_le_bytes());
            }
            out.push((format!("{name}.row_scale"), Dtype::F16, vec![rows], sc));
            out.push((name, Dtype::I8, shape, q));
        } else {
            out.push((name, dtype, shape, bytes));
        }
    }
    Ok(out)
}

/// The full names of layer `l`'s dense tensors.
pub fn layer_names(inv: &Inventory, l: usize) -> Vec<String> {
    inv.dense_layer_names(l)
}

/// The tail tensors, full names (K3: final norm, output AttnRes, lm_head).
pub fn global_names(inv: &Inventory) -> Vec<String> {
    inv.names.tail.iter().map(|n| inv.name(n)).collect()
}

/// The store directory of a format under `root`.
pub fn store_dir(root: &Path, format: SpineFormat) -> PathBuf {
    root.join("deltafin-spine").join(format.dir_name())
}

/// The files of a store for `num_layers` layers: every layer, then `global.bin`, `embed.bin`.
pub fn store_files(dir: &Path, num_layers: usize) -> Vec<PathBuf> {
    (0..num_layers)
        .map(|l| dir.join(format!("layer-{l:03}.bin")))
        .chain([dir.join("global.bin"), dir.join("embed.bin")])
        .collect()
}

/// What a spine store holds relative to the checkpoint with fingerprint `source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreState {
    /// Every file complete and built from this checkpoint.
    Current,
    /// No complete file at all.
    Missing,
    /// `done` of `total` files complete and current; none from another checkpoint.
    Partial {
        /// Current files.
        done: usize,
        /// All files.
        total: usize,
    },
    /// `stale` complete files were built from another checkpoint (or record none).
    Stale {
        /// Files from another checkpoint.
        stale: usize,
        /// A source one of them records (`None`: unrecorded, an older deltafin).
        built_from: Option<String>,
    },
}

/// The state of the `format` store under `root` for a checkpoint of `num_layers` layers whose
/// fingerprint is `source`.
pub fn store_state(
    root: &Path,
    format: SpineFormat,
    num_layers: usize,
    source: &str,
) -> StoreState {
    let files = store_files(&store_dir(root, format), num_layers);
    let (mut done, mut stale, mut built_from) = (0, 0, None);
    for p in &files {
        match file_source(p) {
            Some(Some(s)) if s == source => done += 1,
            Some(other) => {
                stale += 1;
                if built_from.is_none() {
                    built_from = other;
                }
            }
            None => {}
        }
    }
    if stale > 0 {
        StoreState::Stale { stale, built_from }
    } else if done == files.len() {
        StoreState::Current
    } else if done == 0 {
        StoreState::Missing
    } else {
        StoreState::Partial {
            done,
            total: files.len(),
        }
    }
}

/// Converts the spine of the checkpoint in `inv` into `store_dir(out_root, format)`, skipping
/// files that are already complete; `progress(done, total)` is called after each file.
pub fn convert_spine(
    inv: &Inventory,
    num_layers: usize,
    out_root: &Path,
    format: SpineFormat,
    progress: impl FnMut(usize, usize),
) -> Result<PathBuf> {
    let spine = ShardSpine::new(std::sync::Arc::new(inv.clone()));
    convert_spine_from(&spine, inv, num_layers, out_root, format, progress)
}

/// `convert_spine` with the tensor bytes from any source (the hub, for a streaming install).
pub fn convert_spine_from(
    spine: &dyn TensorBytes,
    inv: &Inventory,
    num_layers: usize,
    out_root: &Path,
    format: SpineFormat,
    mut progress: impl FnMut(usize, usize),
) -> Result<PathBuf> {
    let _lock = crate::fsio::RootLock::acquire(out_root)?;
    let dir = store_dir(out_root, format);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    for t in crate::fsio::atomic::sweep(&dir) {
        tracing::warn!(
            "removed {} (left by an interrupted conversion)",
            t.display()
        );
    }
    let fp = crate::checkpoint::Source::of(inv).fingerprint();
    if let StoreState::Stale { stale, built_from } = store_state(out_root, format, num_layers, &fp)
    {
        tracing::warn!(
            "{stale} file(s) in {} were built from another checkpoint (source {}); rebuilding them from {fp}",
            dir.display(),
            built_from.as_deref().unwrap_or("unrecorded")
        );
    }
    let total = num_layers + 2;
    let mut done = 0;
    for l in 0..num_layers {
        let path = dir.join(format!("layer-{l:03}.bin"));
        if !is_current(&path, &fp) {
            let names = layer_names(inv, l);
            let tensors =
                convert_group(spine, &names, &inv.layer_name(l, ""), (format, &inv.names))?;
            write_file(&path, &tensors, &fp)?;
        }
        done += 1;
        progress(done, total);
    }
    let global = dir.join("global.bin");
    if !is_current(&global, &fp) {
        let tensors = convert_group(spine, &global_names(inv), &inv.prefix, (format, &inv.names))?;
        write_file(&global, &tensors, &fp)?;
    }
    done += 1;
    progress(done, total);
    let embed = dir.join("embed.bin");
    if !is_current(&embed, &fp) {
        let tensors = convert_group(
            spine,
            &[inv.name(&inv.names.embedding)],
            &inv.prefix,
            (SpineFormat::Bf16, &inv.names),
        )?;
        write_file(&embed, &tensors, &fp)?;
    }
    progress(total, total);
    Ok(dir)
}
