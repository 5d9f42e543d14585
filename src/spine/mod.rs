//! The spine: every dense tensor of the model. `source::Spine` hands the model each layer (from the
//! converted store or the shards, pinned or streamed); `ShardSpine` reads raw tensors from shards.

mod ahead;
mod backing;
pub mod convert;
pub mod device;
mod gather;
pub mod layer;
pub mod options;
pub mod report;
pub mod slot;
pub mod source;

pub use backing::choose_pinned;
pub use device::{DeviceCopy, DeviceSide};

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::checkpoint::{Dtype, Inventory, ShardFiles, TensorInfo};
use crate::{Error, Result};

/// Reads spine tensors straight from the checkpoint shards (BF16/F16/F32 widened exactly).
pub struct ShardSpine {
    inv: Arc<Inventory>,
    files: ShardFiles,
}

impl ShardSpine {
    /// A source over the shards listed in `inv`.
    pub fn new(inv: Arc<Inventory>) -> Self {
        ShardSpine {
            files: ShardFiles::new(inv.clone()),
            inv,
        }
    }

    /// Where a tensor lies.
    pub fn info(&self, name: &str) -> Result<&TensorInfo> {
        self.inv.get(name).ok_or_else(|| Error::Tensor {
            name: name.into(),
            msg: format!("missing from the checkpoint in {}", self.inv.dir.display()),
        })
    }

    /// Reads a tensor's bytes into `dst` (`t.len()` bytes).
    pub fn read_into(&self, t: &TensorInfo, dst: &mut [u8]) -> Result<()> {
        let f = self.files.get(t.shard)?;
        f.read_exact_at(dst, t.start)
            .map_err(|e| Error::io(self.inv.shard_path(t.shard), e))
    }

    /// Reads `dst.len()` bytes of shard `shard` from `off`.
    pub fn read_at(&self, shard: usize, dst: &mut [u8], off: u64) -> Result<()> {
        self.files
            .get(shard)?
            .read_exact_at(dst, off)
            .map_err(|e| Error::io(self.inv.shard_path(shard), e))
    }

    /// The open file of shard `shard`.
    pub fn file(&self, shard: usize) -> Result<Arc<std::fs::File>> {
        self.files.get(shard)
    }

    /// Shard `shard` opened for direct reads (`fsio::direct`); `None` where they are refused.
    pub fn direct_file(&self, shard: usize) -> Result<Option<Arc<std::fs::File>>> {
        self.files.get_direct(shard)
    }

    /// Path of shard `shard`.
    pub fn shard_path(&self, shard: usize) -> std::path::PathBuf {
        self.inv.shard_path(shard)
    }

    /// Raw bytes of a tensor.
    pub fn bytes(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)> {
        let t = self.info(name)?;
        let mut buf = vec![0u8; t.len() as usize];
        self.read_into(t, &mut buf)?;
        Ok((buf, t.dtype, t.shape.clone()))
    }
}

/// Widens little-endian BF16/F16/F32 bytes to f32 exactly.
pub fn to_f32(bytes: &[u8], dtype: Dtype, name: &str) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        other => {
            return Err(Error::Tensor {
                name: name.into(),
                msg: format!("dtype {} is not a float type", other),
            })
        }
    })
}
