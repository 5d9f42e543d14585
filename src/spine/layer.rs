//! `LayerData`: the dense tensors of one layer in one buffer, from a spine file (one sequential
//! read) or gathered from the shards; and the spine file format.
//!
//! File format (`layer-NNN.bin`, `global.bin`, `embed.bin`): `DFSPINE1`, a little-endian u64
//! header length, a JSON header `{"version":1,"source":"<checkpoint fingerprint>","tensors":
//! [{"name","dtype","shape","offset","len","checksum"}]}` (`source`: see
//! `checkpoint::source`; a file without it is of unknown origin and never current), zero padding to 4096 bytes, then the tensors, each at a 64-byte aligned
//! absolute `offset`. Row-int8 matrices are stored as `I8` under their name plus an `F16`
//! `[rows]` tensor named `<name>.row_scale`.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use candle::{Device, Tensor};

use super::to_f32;
use crate::checkpoint::Dtype;
use crate::checkpoint::DtypeExt;
use crate::fsio::checksum;
use crate::fsio::{BufPool, PooledBuf};
use crate::{Error, Result};

/// File magic.
pub const MAGIC: &[u8; 8] = b"DFSPINE1";
const DATA_ALIGN: usize = 4096;
const TENSOR_ALIGN: usize = 64;

/// One tensor inside a `LayerData` buffer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    /// Name (layer-relative for layer files, e.g. `self_attn.q_proj.weight`).
    pub name: String,
    /// Element type (`BF16`, `F32`, `I8`, `F16`; safetensors' spelling in the file).
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte offset in the buffer.
    pub offset: usize,
    /// Byte length.
    pub len: usize,
    /// Checksum of the bytes.
    pub checksum: u64,
}

/// The tensors of one layer (or of the tail) in one buffer.
pub struct LayerData {
    pub(super) buf: PooledBuf,
    /// Tensors in layout order (file order, or gather order for the shards).
    pub(super) entries: Vec<Entry>,
    /// Name → position in `entries` (for lookups by name, never on the hot path).
    index: HashMap<String, usize>,
    /// The checkpoint fingerprint the file was built from (`None`: a packed or legacy buffer).
    source: Option<String>,
    /// The same bytes on the compute device (a template layer or a pinned copy), if any.
    pub(super) device: Option<super::DeviceCopy>,
    /// The host arithmetic of its matrices (the spine's `SpineOptions::dense`).
    pub(super) kernel: crate::kernels::dense::DenseKernel,
    /// For a layer mapped for one pass: its read-ahead, told which tensor is used next.
    pub(super) ahead: Option<Box<super::ahead::LayerAhead>>,
}

impl LayerData {
    /// Packs `(name, dtype, shape, bytes)` tensors into one buffer (no header).
    pub fn pack(tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) -> Self {
        let (entries, bytes) = layout(&tensors, 0);
        let mut buf = vec![0u8; bytes];
        for (e, (_, _, _, b)) in entries.iter().zip(&tensors) {
            buf[e.offset..e.offset + e.len].copy_from_slice(b);
        }
        LayerData {
            buf: PooledBuf::owned(buf),
            index: index_of(&entries),
            entries,
            source: None,
            device: None,
            kernel: Default::default(),
            ahead: None,
        }
    }

    /// A buffer gathered from the shards with its layout (`spine::gather`).
    pub(super) fn from_gathered(buf: PooledBuf, entries: Vec<Entry>) -> Self {
        LayerData {
            buf,
            index: index_of(&entries),
            entries,
            source: None,
            device: None,
            kernel: Default::default(),
            ahead: None,
        }
    }

    /// The checkpoint fingerprint the file this came from records (`None` for a buffer packed
    /// from the shards or a file of unknown origin).
    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    /// A tensor's bytes (copied), dtype and shape.
    pub fn raw_tensor(&self, name: &str) -> Result<(Vec<u8>, Dtype, Vec<usize>)> {
        let e = self.entry(name)?;
        Ok((self.data(e)?.to_vec(), e.dtype, e.shape.clone()))
    }

    /// Names of the tensors held.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.entries.iter().map(|e| &e.name)
    }

    /// The tensors, in layout order (what `bind` resolves slots against).
    pub fn layout(&self) -> &[Entry] {
        &self.entries
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// The whole buffer (what a template layer receives).
    pub fn raw(&self) -> &[u8] {
        &self.buf
    }

    /// Whether tensor `name` is held.
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// Records where the same bytes lie on the compute device.
    pub fn attach_device(&mut self, device: super::DeviceCopy) {
        self.device = Some(device);
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.index
            .get(name)
            .inspect(|&&i| self.touch(i))
            .and_then(|&i| self.entries.get(i))
            .ok_or_else(|| Error::Tensor {
                name: name.into(),
                msg: "missing from the layer's spine data".into(),
            })
    }

    /// Tells a mapped layer's read-ahead that tensor `idx` is used now.
    pub(super) fn touch(&self, idx: usize) {
        if let Some(a) = &self.ahead {
            a.touch(idx);
        }
    }

    pub(super) fn data(&self, e: &Entry) -> Result<&[u8]> {
        self.buf
            .get(e.offset..e.offset + e.len)
            .ok_or_else(|| Error::Tensor {
                name: e.name.clone(),
                msg: "byte range outside the layer buffer".into(),
            })
    }

    /// A tensor as f32 values, checked against `shape` (int8 matrices are dequantised).
    pub fn values(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let e = self.entry(name)?;
        if e.shape != shape {
            return Err(Error::Tensor {
                name: name.into(),
                msg: format!("expected shape {shape:?}, found {:?}", e.shape),
            });
        }
        match e.dtype {
            Dtype::I8 => Ok(self.matrix(name, shape[0], shape[1])?.to_f32()),
            d => to_f32(self.data(e)?, d, name),
        }
    }

    /// A tensor as an f32 Candle tensor.
    pub fn tensor(&self, name: &str, shape: &[usize], device: &Device) -> Result<Tensor> {
        Ok(Tensor::from_vec(self.values(name, shape)?, shape, device)?)
    }

    /// Checks every tensor's checksum.
    pub fn verify(&self) -> Result<()> {
        for e in &self.entries {
            if checksum(self.data(e)?) != e.checksum {
                return Err(Error::Tensor {
                    name: e.name.clone(),
                    msg: "checksum mismatch in the spine file (re-run the conversion)".into(),
                });
            }
        }
        Ok(())
    }
}

fn index_of(entries: &[Entry]) -> HashMap<String, usize> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.name.clone(), i))
        .collect()
}

fn layout(tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)], start: usize) -> (Vec<Entry>, usize) {
    place(
        tensors
            .iter()
            .map(|(n, d, s, b)| (n, *d, s, b.len(), checksum(b))),
        start,
    )
}

/// Entries for `(name, dtype, shape, length, checksum)` placed from `start`, each 64-byte
/// aligned; returns them and the end offset.
fn place<'a>(
    items: impl Iterator<Item = (&'a String, Dtype, &'a Vec<usize>, usize, u64)>,
    start: usize,
) -> (Vec<Entry>, usize) {
    let mut off = start;
    let mut entries = Vec::new();
    for (name, dtype, shape, len, sum) in items {
        off = off.div_ceil(TENSOR_ALIGN) * TENSOR_ALIGN;
        entries.push(Entry {
            name: name.clone(),
            dtype,
            shape: shape.clone(),
            offset: off,
            len,
            checksum: sum,
        });
        off += len;
    }
    (entries, off)
}

/// The header bytes (magic, length, JSON, padding) and the total file size for `tensors`.
fn header_for(
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    source: &str,
) -> (Vec<u8>, Vec<Entry>, usize) {
    // The header's own size fixes the data start; offsets do not change the JSON length much,
    // so iterate until the data start is stable.
    let mut data_start = DATA_ALIGN;
    loop {
        let (entries, end) = layout(tensors, data_start);
        let json =
            serde_json::json!({"version": 1, "source": source, "tensors": entries}).to_string();
        let need = (16 + json.len()).div_ceil(DATA_ALIGN) * DATA_ALIGN;
        if need <= data_start {
            let mut h = MAGIC.to_vec();
            h.extend_from_slice(&(json.len() as u64).to_le_bytes());
            h.extend_from_slice(json.as_bytes());
            h.resize(data_start, 0);
            return (h, entries, end);
        }
        data_start = need;
    }
}

/// Writes a spine file built from the checkpoint with fingerprint `source` atomically
/// (temporary name, fsync, rename).
pub fn write_file(
    path: &Path,
    tensors: &[(String, Dtype, Vec<usize>, Vec<u8>)],
    source: &str,
) -> Result<()> {
    use std::io::Write;
    let (header, entries, end) = header_for(tensors, source);
    crate::fsio::atomic::write_atomic_with(path, |w| {
        w.write_all(&header).map_err(|e| Error::io(path, e))?;
        let mut pos = header.len();
        for (e, (_, _, _, b)) in entries.iter().zip(tensors) {
            w.write_all(&vec![0u8; e.offset - pos])
                .map_err(|e| Error::io(path, e))?;
            w.write_all(b).map_err(|e| Error::io(path, e))?;
            pos = e.offset + b.len();
        }
        debug_assert_eq!(pos, end);
        Ok(())
    })
}

/// Parses a spine file's header from its first bytes.
pub fn parse_header(bytes: &[u8], file_len: usize, path: &Path) -> Result<Vec<Entry>> {
    parse_header_full(bytes, file_len, path).map(|(e, _)| e)
}

/// `parse_header` and the checkpoint fingerprint the file records (if any).
pub fn parse_header_full(
    bytes: &[u8],
    file_len: usize,
    path: &Path,
) -> Result<(Vec<Entry>, Option<String>)> {
    let bad = |m: String| Error::Shard {
        path: path.to_path_buf(),
        msg: m,
    };
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(bad("not a deltafin spine file (bad magic)".into()));
    }
    let n = u64::from_le_bytes(
        bytes[8..16]
            .try_into()
            .map_err(|_| bad("short header".into()))?,
    ) as usize;
    let json = bytes
        .get(16..16usize.saturating_add(n))
        .ok_or_else(|| bad("truncated header".into()))?;
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| bad(format!("header is not JSON: {e}")))?;
    let entries: Vec<Entry> = serde_json::from_value(v["tensors"].clone())
        .map_err(|e| bad(format!("bad header: {e}")))?;
    let source = v["source"].as_str().map(String::from);
    for e in &entries {
        if e.offset.checked_add(e.len).is_none_or(|end| end > file_len) {
            return Err(bad(format!(
                "tensor `{}` runs past the end of the file (truncated?)",
                e.name
            )));
        }
        // The length must be what the dtype and shape say (no overflow, no short tensors).
        let size = e.dtype.bytes() as usize;
        let want = e
            .shape
            .iter()
            .try_fold(size, |a, &d| a.checked_mul(d))
            .filter(|_| !e.shape.is_empty());
        if want != Some(e.len) {
            return Err(bad(format!(
                "tensor `{}` is {} bytes, but {} {:?} needs {:?}",
                e.name, e.len, e.dtype, e.shape, want
            )));
        }
    }
    Ok((entries, source))
}

/// Reads a whole spine file with one sequential read into a pooled aligned buffer.
pub fn read_file(path: &Path, pool: &Arc<BufPool>) -> Result<LayerData> {
    read_file_sized(path, pool, 0)
}

/// A whole store file mapped privately instead of read (pinned layers: `bench spine` loaded and
/// read 4 K3-slice layers, 5.7 GB, in 2.8 s mapped against 11.5 s read into buffers cold, and
/// 0.4 s against 6.1 s warm, for the same resident memory; README "Dependencies").
pub fn map_file(path: &Path) -> Result<LayerData> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    from_file_bytes(PooledBuf::mapped(&f, path)?, len, path)
}

/// A whole store file mapped for one pass over it (a streamed layer larger than the memory
/// budget): the page cache holds the pages only while they are read (and what the spine's
/// read-ahead asks for next), so the resident part is a few matrices' worth, not the layer.
pub fn map_file_streaming(path: &Path) -> Result<LayerData> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    from_file_bytes(PooledBuf::mapped_streaming(&f, path)?, len, path)
}

/// `read_file` into a buffer of at least `cap` bytes when a new one must be allocated.
pub fn read_file_sized(path: &Path, pool: &Arc<BufPool>, cap: usize) -> Result<LayerData> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let mut buf = pool.take_sized(len, cap)?;
    f.read_exact(&mut buf).map_err(|e| Error::io(path, e))?;
    from_file_bytes(buf, len, path)
}

/// `read_file_sized` with parallel `O_DIRECT` reads (`fsio::direct`) where the platform and the
/// filesystem allow them, else the buffered read: for streamed layers the page cache cannot hold.
pub fn read_file_direct(path: &Path, pool: &Arc<BufPool>, cap: usize) -> Result<LayerData> {
    use crate::fsio::direct::{read_all, IO_ALIGN};
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len() as usize;
    let padded = len.div_ceil(IO_ALIGN) * IO_ALIGN;
    let mut buf = pool.take_sized(padded, cap.max(padded))?;
    if !read_all(path, len, &mut buf)? {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        f.read_exact(&mut buf[..len])
            .map_err(|e| Error::io(path, e))?;
    }
    from_file_bytes(buf, len, path)
}

/// A layer from the whole bytes of its store file (`len` bytes at `path`).
fn from_file_bytes(buf: PooledBuf, len: usize, path: &Path) -> Result<LayerData> {
    let (entries, source) = parse_header_full(&buf, len, path)?;
    Ok(LayerData {
        buf,
        index: index_of(&entries),
        entries,
        source,
        device: None,
        kernel: Default::default(),
        ahead: None,
    })
}

/// What a spine file on disk is: absent or broken (`None`), or complete with the checkpoint
/// fingerprint it records (`Some(None)` when it records none).
pub fn file_source(path: &Path) -> Option<Option<String>> {
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    let mut head = vec![0u8; DATA_ALIGN.min(len)];
    if f.read_exact(&mut head).is_err() || head.len() < 16 {
        return None;
    }
    let n = u64::from_le_bytes(head[8..16].try_into().unwrap_or([0; 8])) as usize;
    if 16usize.saturating_add(n) > head.len() {
        let mut more = vec![0u8; 16usize.saturating_add(n).min(len) - head.len()];
        f.read_exact(&mut more).ok()?;
        head.extend(more);
    }
    parse_header_full(&head, len, path).ok().map(|(_, s)| s)
}

/// Whether `path` holds a complete spine file (header parses and every tensor fits).
pub fn is_complete(path: &Path) -> bool {
    file_source(path).is_some()
}

/// Whether `path` holds a complete spine file built from the checkpoint `source`.
pub fn is_current(path: &Path, source: &str) -> bool {
    file_source(path).is_some_and(|s| s.as_deref() == Some(source))
}

#[cfg(test)]
#[path = "layer_tests.rs"]
mod tests;
