//! Dense tensors read in place from memory-mapped safetensors shards: where each matrix or
//! vector lies (`Stored`, checked against the expected shape with errors naming the tensor and
//! the directory), the maps themselves (`Mapped`), and the few things a family does with them:
//! `x · Wᵀ` through the crate's dense kernels (BF16 or F32 as stored, never widened to an fp32
//! copy), embedding rows, small vectors widened. For families that keep their dense layers
//! resident in the page cache (gpt-oss, Qwen3-MoE); K3's spine store is `spine/`. Owns no
//! model's names or order.

use memmap2::Mmap;
use safetensors::Dtype;

use crate::checkpoint::Inventory;
use crate::kernels::dense::{gemm, DenseData, DenseKernel, DenseMatrix};
use crate::{Error, Result};

/// Where one stored matrix or vector lies.
#[derive(Debug, Clone, Copy)]
pub struct Stored {
    /// The shard.
    pub shard: usize,
    /// Absolute byte range in the shard.
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
    /// BF16 or F32.
    pub dtype: Dtype,
    /// Rows (1 for a vector).
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

/// BF16 or F32 little-endian bytes as f32.
pub fn to_f32(b: &[u8], dtype: Dtype) -> Vec<f32> {
    match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// A `[rows, cols]` BF16 or F32 tensor (`rows == 1` also accepts a `[cols]` vector).
pub fn matrix(inv: &Inventory, name: &str, rows: usize, cols: usize) -> Result<Stored> {
    let t = inv.get(name).ok_or_else(|| Error::Tensor {
        name: name.into(),
        msg: format!("missing from the checkpoint in {}", inv.dir.display()),
    })?;
    let shape_ok = t.shape == [rows, cols] || (rows == 1 && t.shape == [cols]);
    if !matches!(t.dtype, Dtype::BF16 | Dtype::F32) || !shape_ok {
        return Err(Error::Tensor {
            name: name.into(),
            msg: format!(
                "expected BF16 or F32 [{rows}, {cols}], found {} {:?}",
                t.dtype, t.shape
            ),
        });
    }
    Ok(Stored {
        shard: t.shard,
        start: t.start as usize,
        end: t.end as usize,
        dtype: t.dtype,
        rows,
        cols,
    })
}

/// Every shard of a checkpoint, mapped read-only.
pub struct Mapped {
    maps: Vec<Mmap>,
    /// The host arithmetic of its matrices.
    kernel: DenseKernel,
}

impl Mapped {
    /// Maps every shard `inv` lists.
    pub fn open(inv: &Inventory) -> Result<Self> {
        let maps = (0..inv.shards.len())
            .map(|i| {
                let p = inv.shard_path(i);
                let f = std::fs::File::open(&p).map_err(|e| Error::io(&p, e))?;
                // SAFETY: the shard is opened read-only; the model never writes it, and a
                // checkpoint replaced underneath a running engine is outside its contract
                // (installs write new files and rename them into place).
                unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&p, e))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Mapped {
            maps,
            kernel: DenseKernel::Exact,
        })
    }

    /// Bytes mapped (resident once touched: never re-read per token).
    pub fn len(&self) -> u64 {
        self.maps.iter().map(|m| m.len() as u64).sum()
    }

    /// True when nothing is mapped.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of `s`.
    pub fn bytes(&self, s: &Stored) -> &[u8] {
        &self.maps[s.shard][s.start..s.end]
    }

    /// Computes every matrix from now on with `kernel` (`LoadOptions::dense_kernel`).
    pub fn set_kernel(&mut self, kernel: DenseKernel) {
        self.kernel = kernel;
    }

    /// `s` as a dense-kernel matrix.
    pub fn dense(&self, s: &Stored) -> Result<DenseMatrix<'_>> {
        let b = self.bytes(s);
        let data = match s.dtype {
            Dtype::F32 => DenseData::F32(b),
            _ => DenseData::Bf16(b),
        };
        Ok(DenseMatrix::new(data, s.rows, s.cols)?.with_kernel(self.kernel))
    }

    /// A `[n]` BF16 or F32 vector `name`, widened.
    pub fn vector(&self, inv: &Inventory, name: &str, n: usize) -> Result<Vec<f32>> {
        let s = matrix(inv, name, 1, n)?;
        Ok(to_f32(self.bytes(&s), s.dtype))
    }

    /// `x · Wᵀ` for `t` rows of `x` → `[t, w.rows]`.
    pub fn matmul(&self, w: &Stored, x: &[f32], t: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; t * w.rows];
        gemm(&self.dense(w)?, x, t, &mut y)?;
        Ok(y)
    }

    /// The rows of `table` (`[vocab, width]`) for `ids`, widened (ids checked by the caller).
    pub fn rows(&self, table: &Stored, ids: &[u32]) -> Vec<f32> {
        let w = table.cols;
        let size = if table.dtype == Dtype::F32 { 4 } else { 2 };
        let all = self.bytes(table);
        ids.iter()
            .flat_map(|&i| to_f32(&all[i as usize * w * size..][..w * size], table.dtype))
            .collect()
    }
}
