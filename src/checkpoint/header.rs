//! safetensors header parsing from the header bytes alone (a local file or a range fetch).

use std::io::Read;
use std::path::Path;

use crate::{Error, Result};

/// Largest header we accept (the safetensors crate's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// The dtypes safetensors defines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StDtype {
    /// bool (1 byte).
    Bool,
    /// u8.
    U8,
    /// i8.
    I8,
    /// f8 e4m3.
    F8E4M3,
    /// f8 e5m2.
    F8E5M2,
    /// i16.
    I16,
    /// u16.
    U16,
    /// f16.
    F16,
    /// bf16.
    BF16,
    /// i32.
    I32,
    /// u32.
    U32,
    /// f32.
    F32,
    /// f64.
    F64,
    /// i64.
    I64,
    /// u64.
    U64,
}

impl StDtype {
    /// Parses a safetensors dtype string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "BOOL" => Self::Bool,
            "U8" => Self::U8,
            "I8" => Self::I8,
            "F8_E4M3" => Self::F8E4M3,
            "F8_E5M2" => Self::F8E5M2,
            "I16" => Self::I16,
            "U16" => Self::U16,
            "F16" => Self::F16,
            "BF16" => Self::BF16,
            "I32" => Self::I32,
            "U32" => Self::U32,
            "F32" => Self::F32,
            "F64" => Self::F64,
            "I64" => Self::I64,
            "U64" => Self::U64,
            _ => return None,
        })
    }

    /// The safetensors spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bool => "BOOL",
            Self::U8 => "U8",
            Self::I8 => "I8",
            Self::F8E4M3 => "F8_E4M3",
            Self::F8E5M2 => "F8_E5M2",
            Self::I16 => "I16",
            Self::U16 => "U16",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::I32 => "I32",
            Self::U32 => "U32",
            Self::F32 => "F32",
            Self::F64 => "F64",
            Self::I64 => "I64",
            Self::U64 => "U64",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Self::Bool | Self::U8 | Self::I8 | Self::F8E4M3 | Self::F8E5M2 => 1,
            Self::I16 | Self::U16 | Self::F16 | Self::BF16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::F64 | Self::I64 | Self::U64 => 8,
        }
    }
}

/// One tensor entry of a header, with absolute byte offsets in the shard file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: StDtype,
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
    let text =
        std::str::from_utf8(json).map_err(|e| bad(label, format!("header is not UTF-8: {e}")))?;
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(label, format!("header is not JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| bad(label, "header is not a JSON object"))?;
    let mut tensors = Vec::with_capacity(obj.len());
    for (name, entry) in obj {
        if name == "__metadata__" {
            continue;
        }
        let e = entry
            .as_object()
            .ok_or_else(|| bad(label, format!("tensor `{name}`: entry is not an object")))?;
        let dtype_s = e
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| bad(label, format!("tensor `{name}`: missing dtype")))?;
        let dtype = StDtype::parse(dtype_s)
            .ok_or_else(|| bad(label, format!("tensor `{name}`: unknown dtype `{dtype_s}`")))?;
        let shape_v = e
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad(label, format!("tensor `{name}`: missing shape")))?;
        let mut shape = Vec::with_capacity(shape_v.len());
        let mut numel: u64 = 1;
        for d in shape_v {
            let d = d.as_u64().ok_or_else(|| {
                bad(
                    label,
                    format!("tensor `{name}`: shape entry {d} is not a non-negative integer"),
                )
            })?;
            numel = numel
                .checked_mul(d)
                .ok_or_else(|| bad(label, format!("tensor `{name}`: shape overflows")))?;
            shape.push(
                usize::try_from(d)
                    .map_err(|_| bad(label, format!("tensor `{name}`: dimension too large")))?,
            );
        }
        let offs = e
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| {
                bad(
                    label,
                    format!("tensor `{name}`: data_offsets must be [start, end]"),
                )
            })?;
        let (a, b) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                return Err(bad(
                    label,
                    format!("tensor `{name}`: data_offsets are not integers"),
                ))
            }
        };
        if b < a {
            return Err(bad(
                label,
                format!("tensor `{name}`: data_offsets end {b} < start {a}"),
            ));
        }
        if b > data_len {
            return Err(bad(label, format!("tensor `{name}`: data_offsets end {b} is beyond the {data_len}-byte data section (truncated file?)")));
        }
        let want = numel
            .checked_mul(dtype.size())
            .ok_or_else(|| bad(label, format!("tensor `{name}`: byte size overflows")))?;
        if b - a != want {
            return Err(bad(label, format!("tensor `{name}`: {} bytes in data_offsets but dtype {} and shape {shape:?} need {want}", b - a, dtype.as_str())));
        }
        tensors.push(HeaderTensor {
            name: name.clone(),
            dtype,
            shape,
            start: data_start + a,
            end: data_start + b,
        });
    }
    tensors.sort_by_key(|t| (t.start, t.end));
    for w in tensors.windows(2) {
        if w[1].start < w[0].end {
            return Err(bad(
                label,
                format!("tensors `{}` and `{}` overlap", w[0].name, w[1].name),
            ));
        }
    }
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

/// Serialises a safetensors header for tensors given in data order, padded to 8 bytes.
/// Returns the full prefix (length + JSON) to write before the data.
pub fn build_header(entries: &[(String, StDtype, Vec<usize>)]) -> Vec<u8> {
    let mut json = String::from("{");
    let mut off = 0u64;
    for (i, (name, dtype, shape)) in entries.iter().enumerate() {
        let n: u64 = shape.iter().map(|&d| d as u64).product::<u64>() * dtype.size();
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            "{}:{{\"dtype\":\"{}\",\"shape\":{},\"data_offsets\":[{},{}]}}",
            serde_json::Value::String(name.clone()),
            dtype.as_str(),
            serde_json::to_string(shape).unwrap_or_default(),
            off,
            off + n
        ));
        off += n;
    }
    json.push('}');
    while (json.len() + 8) % 8 != 0 {
        json.push(' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out
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
            ("a".into(), StDtype::BF16, vec![2, 3]),
            ("b".into(), StDtype::U8, vec![5]),
            ("c".into(), StDtype::F32, vec![1]),
        ]);
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
