//! safetensors headers read from the header bytes alone (a local file or a range fetch): the 8-byte
//! length is checked here against the file size, and the JSON is deserialised and validated by the
//! `safetensors` crate (`tensor::Metadata`: dtypes, shapes, offsets that tile the data section).
//! Ours is only what the crate cannot know: that the data fits the file, absolute offsets, errors
//! that name the file, and the header's SHA-256.

use std::io::Read;
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};

use crate::{Error, Result};

/// Largest header we accept (the safetensors crate's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The safetensors crate's dtype.
pub use safetensors::Dtype;

/// What this crate needs of a `Dtype` beyond the crate's own methods.
pub trait DtypeExt: Sized {
    /// Parses the safetensors spelling (`"BF16"`), as the crate's deserialiser does.
    fn parse(s: &str) -> Option<Self>;
    /// Bytes per element (whole-byte dtypes: K3's BF16, F32 and U8, the spine's I8 and F16).
    fn bytes(self) -> u64;
}

impl DtypeExt for Dtype {
    fn parse(s: &str) -> Option<Self> {
        use serde::Deserialize;
        let d = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(s);
        Dtype::deserialize(d).ok()
    }

    fn bytes(self) -> u64 {
        (self.bitsize() / 8) as u64
    }
}

/// One tensor entry of a header, with absolute byte offsets in the shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Absolute start in the file.
    pub start: u64,
    /// Absolute end in the file (exclusive).
    pub end: u64,
}

/// A parsed shard header.
#[derive(Debug, Clone)]
pub struct ShardHeader {
    /// Length of the JSON header in bytes.
    pub header_len: u64,
    /// Tensors, sorted by start offset.
    pub tensors: Vec<HeaderTensor>,
    /// SHA-256 of the JSON header (hex): the shard's layout identity.
    pub header_sha256: String,
}

impl ShardHeader {
    /// Absolute offset of the data section.
    pub fn data_start(&self) -> u64 {
        8 + self.header_len
    }
}

fn bad(label: &Path, msg: impl Into<String>) -> Error {
    Error::Shard {
        path: label.to_path_buf(),
        msg: msg.into(),
    }
}

/// Decodes the 8-byte little-endian header length and checks it against the file size.
pub fn parse_header_len(prefix: &[u8], file_len: u64, label: &Path) -> Result<u64> {
    let first: [u8; 8] = prefix
        .get(..8)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| {
            bad(
                label,
                format!(
                    "truncated: {} bytes, a safetensors file starts with an 8-byte header length",
                    prefix.len()
                ),
            )
        })?;
    let hlen = u64::from_le_bytes(first);
    if hlen > MAX_HEADER_LEN {
        return Err(bad(label, format!("header length {hlen} exceeds the {MAX_HEADER_LEN}-byte limit (not a safetensors file?)")));
    }
    if hlen.saturating_add(8) > file_len {
        return Err(bad(label, format!("header length {hlen} runs past the end of the {file_len}-byte file (truncated download?)")));
    }
    Ok(hlen)
}

/// Parses the JSON header `json` (exactly `header_len` bytes) of a file of `file_len` bytes.
pub fn parse_header_json(json: &[u8], file_len: u64, label: &Path) -> Result<ShardHeader> {
    let header_len = json.len() as u64;
    if header_len.saturating_add(8) > file_len {
        return Err(bad(label, "header runs past the end of the file"));
    }
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    let meta: Metadata = serde_json::from_slice(json)
        .map_err(|e| bad(label, format!("not a valid safetensors header: {e}")))?;
    let end = meta.data_len() as u64;
    if end > data_len {
        return Err(bad(label, format!("tensor data ends at {end}, beyond the {data_len}-byte data section (truncated file?)")));
    }
    let mut tensors: Vec<HeaderTensor> = meta
        .tensors()
        .into_iter()
        .map(|(name, t)| HeaderTensor {
            name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            start: data_start + t.data_offsets.0 as u64,
            end: data_start + t.data_offsets.1 as u64,
        })
        .collect();
    // The crate's validation makes the ranges tile the data section; the order is ours to fix.
    tensors.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    Ok(ShardHeader {
        header_len,
        tensors,
        header_sha256: super::source::sha256_hex(json),
    })
}

/// Parses a header from a buffer holding at least the first `8 + header_len` bytes of a file.
pub fn parse_header_bytes(bytes: &[u8], file_len: u64, label: &Path) -> Result<ShardHeader> {
    let hlen = parse_header_len(bytes, file_len, label)?;
    let end = usize::try_from(8 + hlen).map_err(|_| bad(label, "header too large"))?;
    let json = bytes.get(8..end).ok_or_else(|| {
        bad(
            label,
            format!("truncated: header needs {end} bytes, got {}", bytes.len()),
        )
    })?;
    parse_header_json(json, file_len, label)
}

/// Reads only the header bytes of a local shard and parses them.
pub fn read_header(path: &Path) -> Result<ShardHeader> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut first = [0u8; 8];
    let n = read_full(&mut f, &mut first).map_err(|e| Error::io(path, e))?;
    let hlen = parse_header_len(&first[..n], file_len, path)?;
    let mut json = vec![0u8; hlen as usize];
    f.read_exact(&mut json).map_err(|e| Error::io(path, e))?;
    parse_header_json(&json, file_len, path)
}

fn read_full(f: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Serialises a safetensors header (through the crate's `Metadata`) for tensors given in data
/// order, padded with spaces to 8 bytes as the crate pads. Returns the full prefix (length +
/// JSON) to write before the data.
pub fn build_header(entries: &[(String, Dtype, Vec<usize>)]) -> Result<Vec<u8>> {
    let mut off = 0usize;
    let mut infos = Vec::with_capacity(entries.len());
    for (name, dtype, shape) in entries {
        let n = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        let info = TensorInfo {
            dtype: *dtype,
            shape: shape.clone(),
            data_offsets: (off, off + n),
        };
        infos.push((name.clone(), info));
        off += n;
    }
    let meta = Metadata::new(None, infos)
        .map_err(|e| Error::Msg(format!("cannot build a safetensors header: {e}")))?;
    let mut json = serde_json::to_string(&meta)
        .map_err(|e| Error::Msg(format!("cannot serialise a safetensors header: {e}")))?;
    while !json.len().is_multiple_of(8) {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::rng::Rng;

    fn label() -> &'static Path {
        Path::new("test.safetensors")
    }

    fn sample() -> (Vec<u8>, u64) {
        let h = build_header(&[
            ("a".into(), Dtype::BF16, vec![2, 3]),
            ("b".into(), Dtype::U8, vec![5]),
            ("c".into(), Dtype::F32, vec![1]),
        ])
        .unwrap();
        let len = h.len() as u64 + 12 + 5 + 4;
        (h, len)
    }

    #[test]
    fn parses_built_header() {
        let (h, len) = sample();
        let p = parse_header_bytes(&h, len, label()).unwrap();
        assert_eq!(p.tensors.len(), 3);
        assert_eq!(p.tensors[0].name, "a");
        assert_eq!(p.tensors[0].start, h.len() as u64);
        assert_eq!(p.tensors[2].end, len);
    }

    #[test]
    fn rejects_bad_headers() {
        let (h, len) = sample();
        // truncated prefix
        assert!(parse_header_bytes(&h[..4], len, label()).is_err());
        // header beyond file
        assert!(parse_header_bytes(&h, 10, label()).is_err());
        // data beyond file
        assert!(parse_header_bytes(&h, len - 1, label()).is_err());
        let json = |s: &str| parse_header_json(s.as_bytes(), 1 << 20, label());
        assert!(json("not json").is_err());
        assert!(json("[1,2]").is_err());
        assert!(json(r#"{"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}}"#).is_err());
        assert!(json(r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,3]}}"#).is_err());
        assert!(json(r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[2,0]}}"#).is_err());
        assert!(json(r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#).is_err());
        assert!(json(r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,4]}}"#).is_err());
        assert!(json(r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#).is_err());
        assert!(json(r#"{"__metadata__":{"format":"pt"},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#).is_ok());
    }

    /// Random and mutated headers must give errors, never panics.
    #[test]
    fn fuzz_headers_never_panic() {
        let (h, len) = sample();
        let mut rng = Rng::new(7);
        let mut ok = 0;
        for i in 0..20_000 {
            let mut b = h.clone();
            match i % 4 {
                0 => {
                    for _ in 0..1 + rng.below(4) {
                        let k = rng.below(b.len() as u64) as usize;
                        b[k] = rng.next_u64() as u8;
                    }
                }
                1 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
                2 => {
                    let k = rng.below(b.len() as u64) as usize;
                    let digits = b"0123456789-e.[]{}\",:";
                    b[k] = digits[rng.below(digits.len() as u64) as usize];
                }
                _ => {
                    b = (0..rng.below(64)).map(|_| rng.next_u64() as u8).collect();
                }
            }
            let flen = if i % 7 == 0 { rng.below(len * 2) } else { len };
            if parse_header_bytes(&b, flen, label()).is_ok() {
                ok += 1;
            }
        }
        assert!(ok < 20_000);
    }
}
