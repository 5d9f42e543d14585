//! The dense weights of a streaming install for a family that maps its shards (gpt-oss,
//! Qwen3-MoE): every tensor that is not a routed expert (the family's `is_expert` says which),
//! copied once from the hub's shards by range reads into one local `model.safetensors` under
//! `deltafin-dense/`, which the model maps in place of shards it does not have. The experts
//! stay on the hub and in the disk cache. Written atomically (unique temp, fsync, rename, fsync
//! the directory). Owns the dense file; must not touch the expert cache.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::checkpoint::header::build_header;
use crate::checkpoint::Inventory;
use crate::fsio::atomic::write_atomic_with;
use crate::spine::convert::TensorBytes;
use crate::{Error, Result};

/// The directory of a streaming install's dense file.
pub fn dense_dir(root: &Path) -> PathBuf {
    root.join("deltafin-dense")
}

/// Bytes the dense file holds (every non-expert tensor of `inv`).
pub fn dense_bytes(inv: &Inventory, is_expert: impl Fn(&str) -> bool) -> u64 {
    inv.iter()
        .filter(|(n, _)| !is_expert(n))
        .map(|(_, t)| t.len())
        .sum()
}

/// Writes `root/deltafin-dense/model.safetensors` (every tensor of `inv` but the experts) from `src` (the hub's shards by range
/// reads), reporting `(bytes done, total)`; a finished file of the same tensors is kept.
pub fn write_dense(
    root: &Path,
    inv: &Inventory,
    src: &dyn TensorBytes,
    is_expert: impl Fn(&str) -> bool,
    mut progress: impl FnMut(u64, u64),
) -> Result<PathBuf> {
    let mut names: Vec<&String> = inv
        .iter()
        .map(|(n, _)| n)
        .filter(|n| !is_expert(n))
        .collect();
    names.sort();
    let entries: Vec<_> = names
        .iter()
        .filter_map(|n| inv.get(n).map(|t| ((*n).clone(), t.dtype, t.shape.clone())))
        .collect();
    let header = build_header(&entries)?;
    let dir = dense_dir(root);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let path = dir.join("model.safetensors");
    let total = dense_bytes(inv, &is_expert);
    // A finished file with this exact header holds these tensors (it was renamed into place
    // only once complete).
    if let Ok(h) = crate::checkpoint::header::read_header(&path) {
        let want = header.len() as u64 + total;
        if h.data_start() == header.len() as u64
            && std::fs::metadata(&path).map(|m| m.len()).ok() == Some(want)
        {
            progress(total, total);
            return Ok(path);
        }
    }
    let mut done = 0u64;
    write_atomic_with(&path, |w| {
        w.write_all(&header).map_err(|e| Error::io(&path, e))?;
        for (name, dtype, shape) in &entries {
            let (bytes, got_dtype, got_shape) = src.tensor_bytes(name)?;
            let want = shape.iter().product::<usize>() * dtype.bitsize() / 8;
            if got_dtype != *dtype || got_shape != *shape || bytes.len() != want {
                return Err(Error::Tensor {
                    name: name.clone(),
                    msg: format!(
                        "the hub sent {} bytes of {got_dtype:?} {got_shape:?}; the header says {want} bytes of {dtype:?} {shape:?}",
                        bytes.len()
                    ),
                });
            }
            w.write_all(&bytes).map_err(|e| Error::io(&path, e))?;
            done += bytes.len() as u64;
            progress(done, total);
        }
        Ok(())
    })?;
    Ok(path)
}
