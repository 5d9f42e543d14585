//! Writes the checkpoints the tests and benches run on in the hub's safetensors layout, from a
//! seed: a family lists its tensors (`Tensor`: name, dtype, shape, how the values are drawn)
//! and `write_shards` splits them in order into shards of about equal bytes at tensor
//! boundaries (as the hub's files are cut), with `model.safetensors.index.json`, each tensor's
//! values its own random stream (so they do not depend on the split), large matrices
//! optionally left as holes of a sparse file (full-shape checkpoints in little disk). Files are
//! written atomically. Owns the layout, not any family's names.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use safetensors::Dtype;

use crate::checkpoint::header::{build_header, DtypeExt};
use crate::checkpoint::rng::Rng;
use crate::fsio::atomic::{write_atomic, write_atomic_with};
use crate::{Error, Result};

/// How a tensor's values are drawn.
#[derive(Debug, Clone, Copy)]
pub enum Fill {
    /// BF16 normal × scale.
    Normal(f32),
    /// BF16 `1 + normal × scale` (norm weights).
    AroundOne(f32),
    /// Random E2M1 code bytes.
    Codes,
    /// E8M0 scales in `[lo, lo + span)`.
    Scales(u8, u8),
    /// A hole in a sparse file (reads as zeros, takes no disk).
    Hole,
    /// The first rows hold BF16 normal values, the rest is a hole.
    LeadingRows(usize, f32),
}

/// One tensor of a fixture: its name, dtype, shape and how its values are drawn.
pub struct Tensor {
    /// The stored name.
    pub name: String,
    /// BF16 or U8.
    pub dtype: Dtype,
    /// The stored shape.
    pub shape: Vec<usize>,
    /// The values.
    pub fill: Fill,
}

impl Tensor {
    /// Elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The stored bytes (a hole's leading part only; the rest reads as zeros).
    pub fn bytes(&self, seed: u64) -> Vec<u8> {
        // Each tensor its own stream, so the values do not depend on the shard split.
        let mut rng = Rng::new(seed ^ crate::fsio::checksum(self.name.as_bytes()));
        let n = self.numel();
        let bf16 = |v: f32| half::bf16::from_f32(v).to_le_bytes();
        match self.fill {
            Fill::Normal(s) => (0..n).flat_map(|_| bf16(rng.normal() as f32 * s)).collect(),
            Fill::AroundOne(s) => (0..n)
                .flat_map(|_| bf16(1.0 + rng.normal() as f32 * s))
                .collect(),
            Fill::Codes => (0..n).map(|_| rng.next_u64() as u8).collect(),
            Fill::Scales(lo, span) => (0..n).map(|_| lo + rng.below(span as u64) as u8).collect(),
            Fill::Hole => Vec::new(),
            Fill::LeadingRows(rows, s) => {
                let row: usize = self.shape[1..].iter().product();
                (0..rows.min(self.shape[0]) * row)
                    .flat_map(|_| bf16(rng.normal() as f32 * s))
                    .collect()
            }
        }
    }
}

/// Writes `all` into `dir` as `files` shards (one file is `model.safetensors` with no index,
/// as the hub's single-file checkpoints are; else `shard_name(i, last)` and an index). A
/// tensor for which `keep_with_previous` holds never starts a shard.
pub fn write_shards(
    dir: &Path,
    all: &[Tensor],
    seed: u64,
    files: usize,
    keep_with_previous: &dyn Fn(&str) -> bool,
    shard_name: &dyn Fn(usize, usize) -> String,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let total: usize = all
        .iter()
        .map(|t| t.numel() * t.dtype.bytes() as usize)
        .sum();
    let files = files.clamp(1, all.len());
    // Split in order into `files` runs of about equal bytes.
    let mut runs: Vec<Vec<&Tensor>> = vec![Vec::new()];
    let mut acc = 0usize;
    for t in all {
        let b = t.numel() * t.dtype.bytes() as usize;
        if acc >= total * runs.len() / files && runs.len() < files && !keep_with_previous(&t.name) {
            runs.push(Vec::new());
        }
        acc += b;
        runs.last_mut().expect("one run at least").push(t);
    }
    runs.retain(|r| !r.is_empty());
    let last = runs.len() - 1;
    // One file is `model.safetensors` with no index, as the hub's single-file checkpoints are.
    let name = |i: usize| match last {
        0 => "model.safetensors".to_string(),
        _ => shard_name(i, last),
    };
    let mut weight_map = serde_json::Map::new();
    for (i, run) in runs.iter().enumerate() {
        let path = dir.join(name(i));
        let entries: Vec<_> = run
            .iter()
            .map(|t| (t.name.clone(), t.dtype, t.shape.clone()))
            .collect();
        let header = build_header(&entries)?;
        let io = |e| Error::io(&path, e);
        write_atomic_with(&path, |w| {
            w.write_all(&header).map_err(io)?;
            let mut end = header.len() as u64;
            for t in run {
                let b = t.bytes(seed);
                w.write_all(&b).map_err(io)?;
                let full = (t.numel() * t.dtype.bytes() as usize) as u64;
                if (b.len() as u64) < full {
                    w.seek(SeekFrom::Current((full - b.len() as u64) as i64))
                        .map_err(io)?;
                }
                end += full;
                weight_map.insert(t.name.clone(), name(i).into());
            }
            // A trailing hole only counts once the length covers it.
            w.flush().map_err(io)?;
            w.get_ref().set_len(end).map_err(io)
        })?;
    }
    if last > 0 {
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        write_atomic(
            &dir.join("model.safetensors.index.json"),
            index.to_string().as_bytes(),
        )?;
    }
    Ok(())
}
