//! Matrices bound at load: a `Slot` is a spine matrix resolved once against its layer's layout
//! (position, shape, dtype and row scales checked when the model is built), so a forward pass
//! takes each matrix from the layer's buffer by position, with no name lookup. Also reading a
//! layer's layout without its bytes (a store file's header). Must not read tensor data.

use std::path::Path;

use super::layer::{parse_header, Entry, LayerData};
use crate::checkpoint::Dtype;
use crate::kernels::dense::{DenseData, DenseMatrix};
use crate::{Error, Result};

/// A spine matrix bound once, at load, to its place in a layer's layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    name: String,
    idx: usize,
    scale: Option<usize>,
    rows: usize,
    cols: usize,
}

/// Binds matrix `name` of a layer whose tensors are `layout`: it must be there, `[rows, cols]`,
/// BF16, F32 or row-int8 (with its `.row_scale` `[rows]`).
pub fn bind(layout: &[Entry], name: &str, rows: usize, cols: usize) -> Result<Slot> {
    let find = |n: &str| layout.iter().position(|e| e.name == n);
    let bad = |msg: String| Error::Tensor {
        name: name.into(),
        msg,
    };
    let idx = find(name).ok_or_else(|| bad("missing from the layer's spine data".into()))?;
    let e = &layout[idx];
    if e.shape != [rows, cols] {
        return Err(bad(format!(
            "expected shape [{rows}, {cols}], found {:?}",
            e.shape
        )));
    }
    let scale = match e.dtype {
        Dtype::BF16 | Dtype::F32 => None,
        Dtype::I8 => {
            let si = find(&format!("{name}.row_scale"))
                .ok_or_else(|| bad("row-int8 matrix without its row scales".into()))?;
            if layout[si].shape != [rows] {
                return Err(bad(format!(
                    "row scales of shape {:?}, expected [{rows}]",
                    layout[si].shape
                )));
            }
            Some(si)
        }
        other => return Err(bad(format!("dtype {} cannot be a spine matrix", other))),
    };
    Ok(Slot {
        name: name.to_string(),
        idx,
        scale,
        rows,
        cols,
    })
}

/// The layout of a spine file, from its header alone.
pub fn read_layout(path: &Path) -> Result<Vec<Entry>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let mut head = vec![0u8; 16.min(len)];
    f.read_exact(&mut head).map_err(|e| Error::io(path, e))?;
    let n = head
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| Error::Shard {
            path: path.to_path_buf(),
            msg: "short header".into(),
        })? as usize;
    let want = 16usize.saturating_add(n).min(len);
    let mut more = vec![0u8; want - head.len()];
    f.read_exact(&mut more).map_err(|e| Error::io(path, e))?;
    head.extend(more);
    parse_header(&head, len, path)
}

impl LayerData {
    /// A `[rows, cols]` matrix view (BF16, F32 or row-int8), looked up by name.
    pub fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<DenseMatrix<'_>> {
        self.matrix_at(&bind(&self.entries, name, rows, cols)?)
    }

    /// The matrix a slot bound at load names: no lookup, only a check that this buffer's
    /// layout is the one the slot was bound against.
    pub fn matrix_at(&self, s: &Slot) -> Result<DenseMatrix<'_>> {
        self.touch(s.idx);
        if let Some(si) = s.scale {
            self.touch(si);
        }
        let e = self
            .entries
            .get(s.idx)
            .filter(|e| e.name == s.name && e.shape == [s.rows, s.cols])
            .ok_or_else(|| Error::Tensor {
                name: s.name.clone(),
                msg: "the layer's layout differs from the one its weights were bound to".into(),
            })?;
        let b = self.data(e)?;
        let mut scale_offset = 0;
        let data = match e.dtype {
            Dtype::BF16 => DenseData::Bf16(b),
            Dtype::F32 => DenseData::F32(b),
            Dtype::I8 => {
                let sc =
                    s.scale
                        .and_then(|i| self.entries.get(i))
                        .ok_or_else(|| Error::Tensor {
                            name: s.name.clone(),
                            msg: "row-int8 matrix without its row scales".into(),
                        })?;
                scale_offset = sc.offset;
                DenseData::I8 {
                    q: b,
                    scales: self.data(sc)?,
                }
            }
            other => {
                return Err(Error::Tensor {
                    name: s.name.clone(),
                    msg: format!("dtype {} cannot be a spine matrix", other),
                })
            }
        };
        let mut m = DenseMatrix::new(data, s.rows, s.cols)?.with_kernel(self.kernel);
        m.device = self
            .device
            .as_deref()
            .map(|copy| crate::kernels::dense::DeviceRef {
                copy,
                data: e.offset,
                scales: scale_offset,
            });
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::DtypeExt;

    fn layer(tensors: Vec<(&str, Dtype, Vec<usize>)>) -> LayerData {
        LayerData::pack(
            tensors
                .into_iter()
                .map(|(n, d, s)| {
                    let len = s.iter().product::<usize>() * d.bytes() as usize;
                    (n.to_string(), d, s, vec![1u8; len])
                })
                .collect(),
        )
    }

    #[test]
    fn slots_are_checked_at_bind_and_guarded_at_use() {
        let a = layer(vec![
            ("w", Dtype::BF16, vec![2, 4]),
            ("q", Dtype::I8, vec![3, 4]),
            ("q.row_scale", Dtype::F16, vec![3]),
            ("n", Dtype::F32, vec![4]),
        ]);
        let w = bind(a.layout(), "w", 2, 4).unwrap();
        assert_eq!(a.matrix_at(&w).unwrap().rows, 2);
        let q = bind(a.layout(), "q", 3, 4).unwrap();
        assert_eq!(a.matrix_at(&q).unwrap().cols, 4);
        // Wrong shape, missing tensor, a dtype that is not a matrix: errors at bind (load).
        assert!(bind(a.layout(), "w", 4, 2).is_err());
        assert!(bind(a.layout(), "missing", 2, 4).is_err());
        let b = layer(vec![("q", Dtype::I8, vec![3, 4])]);
        assert!(
            bind(b.layout(), "q", 3, 4).is_err(),
            "int8 without row scales"
        );
        // A buffer whose layout is not the one the slot was bound to is refused, not misread.
        let other = layer(vec![
            ("v", Dtype::BF16, vec![2, 4]),
            ("w", Dtype::BF16, vec![2, 4]),
        ]);
        assert!(other.matrix_at(&w).is_err());
    }
}
