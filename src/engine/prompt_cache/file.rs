//! The state file: one sequence state (a prompt-cache entry or a saved session) on disk.
//!
//! Layout: the magic `DFSTATE\0`, the format version (u32 LE), the header's length (u32 LE) and
//! its checksum (u64 LE), the header (JSON: the checkpoint's fingerprint, the token ids, the
//! arrays' layout and one checksum per array, optional logits and caller data), then the arrays
//! as little-endian f32 in the header's order. Written atomically (unique temporary, fsync,
//! rename, fsync the directory). Reading checks, in order: magic and version, header checksum,
//! fingerprint, layout against the model's, each array's checksum; a file from another
//! checkpoint, version or shape is refused (`corrupt: false`), a truncated or damaged one is
//! reported `corrupt: true` and never loaded. Knows no policy (what to keep, when to evict).

use std::io::{Read, Seek, Write};
use std::path::Path;

use rayon::prelude::*;

use crate::fsio::{atomic::write_atomic_with, checksum};
use crate::runtime::state::{ArrayInfo, ArrayKind, SeqState};
use crate::{Error, Result};

const MAGIC: &[u8; 8] = b"DFSTATE\0";
/// Bumped whenever the layout or the state's meaning changes.
pub const VERSION: u32 = 2;
/// Magic, version, header length, header checksum.
const PREFIX: usize = 8 + 4 + 4 + 8;

/// What a state file says about itself.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// The checkpoint's fingerprint (`checkpoint::Source::fingerprint`).
    pub fingerprint: String,
    /// The tokens the state holds (`state.pos == ids.len()`).
    pub ids: Vec<u32>,
    /// The arrays, in order.
    pub arrays: Vec<ArrayInfo>,
    /// One checksum per array, then one for the logits if any.
    pub sums: Vec<u64>,
    /// Length of the last position's logits stored after the arrays (0: none).
    pub logits: usize,
    /// The caller's own data (a session's history), opaque here.
    #[serde(default)]
    pub extra: serde_json::Value,
}

/// A state file read back.
pub struct Loaded {
    /// Its header.
    pub header: Header,
    /// The state.
    pub state: SeqState,
    /// The stored logits, if any.
    pub logits: Option<Vec<f32>>,
}

#[cfg(not(target_endian = "little"))]
compile_error!("state files hold little-endian f32 written from memory: a big-endian target needs a byte swap here");

/// The bytes of `v` as stored (little-endian f32): the memory itself, no copy.
#[cfg(target_endian = "little")]
fn as_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes, u8 has alignment 1, and the length covers
    // exactly the slice; on a little-endian target they are the stored bytes.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// `v` as bytes to read the stored ones into.
#[cfg(target_endian = "little")]
fn as_bytes_mut(v: &mut [f32]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every bit pattern is a valid f32, so any bytes written are fine.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Writes `state` (holding `ids`) to `path` atomically; returns the bytes written.
pub fn write(
    path: &Path,
    fingerprint: &str,
    ids: &[u32],
    state: &SeqState,
    logits: Option<&[f32]>,
    extra: serde_json::Value,
) -> Result<u64> {
    let arrays = state.arrays();
    let mut parts: Vec<&[f32]> = arrays.iter().map(|a| a.1).collect();
    parts.extend(logits);
    // Written from the state's own memory (no encoded copy), checksummed on every core: the
    // disk, not this, should set the pace.
    let encoded: Vec<&[u8]> = parts.iter().map(|p| as_bytes(p)).collect();
    let sums: Vec<u64> = encoded.par_iter().map(|b| checksum(b)).collect();
    let header = Header {
        fingerprint: fingerprint.to_string(),
        ids: ids.to_vec(),
        arrays: arrays.iter().map(|a| a.0.clone()).collect(),
        sums,
        logits: logits.map_or(0, |l| l.len()),
        extra,
    };
    let h = serde_json::to_vec(&header).map_err(|e| Error::Msg(e.to_string()))?;
    let h_len = u32::try_from(h.len())
        .map_err(|_| Error::Msg(format!("{}: header too large", path.display())))?;
    let mut total = (PREFIX + h.len()) as u64;
    write_atomic_with(path, |w| {
        let io = |e| Error::io(path, e);
        w.write_all(MAGIC).map_err(io)?;
        w.write_all(&VERSION.to_le_bytes()).map_err(io)?;
        w.write_all(&h_len.to_le_bytes()).map_err(io)?;
        w.write_all(&checksum(&h).to_le_bytes()).map_err(io)?;
        w.write_all(&h).map_err(io)?;
        w.flush().map_err(io)?;
        let f = w.get_mut();
        for b in &encoded {
            f.write_all(b).map_err(io)?;
            total += b.len() as u64;
        }
        Ok(())
    })?;
    Ok(total)
}

fn refused(path: &Path, msg: String) -> Error {
    Error::StateFile {
        path: path.to_path_buf(),
        corrupt: false,
        msg,
    }
}

fn corrupt(path: &Path, msg: impl Into<String>) -> Error {
    Error::StateFile {
        path: path.to_path_buf(),
        corrupt: true,
        msg: msg.into(),
    }
}

/// Checks the fixed prefix and the header of `bytes` (at least the prefix and the header).
fn parse_header(path: &Path, bytes: &[u8], fingerprint: &str) -> Result<(Header, usize)> {
    if bytes.len() < PREFIX {
        return Err(corrupt(
            path,
            "truncated: shorter than a state file's prefix",
        ));
    }
    if &bytes[..8] != MAGIC {
        return Err(refused(path, "not a deltafin state file".into()));
    }
    let word = |i: usize| [bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]];
    let version = u32::from_le_bytes(word(8));
    if version != VERSION {
        return Err(refused(
            path,
            format!("state file format v{version}; this build reads v{VERSION} (remove the file, or use the build that wrote it)"),
        ));
    }
    let h_len = u32::from_le_bytes(word(12)) as usize;
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&bytes[16..24]);
    let Some(h) = bytes.get(PREFIX..PREFIX + h_len) else {
        return Err(corrupt(path, "truncated inside the header"));
    };
    if checksum(h) != u64::from_le_bytes(sum) {
        return Err(corrupt(path, "header checksum mismatch"));
    }
    let header: Header =
        serde_json::from_slice(h).map_err(|e| corrupt(path, format!("header: {e}")))?;
    if header.fingerprint != fingerprint {
        return Err(refused(
            path,
            format!(
                "written for checkpoint {} but this model is {fingerprint}: a state from another checkpoint is never loaded",
                header.fingerprint
            ),
        ));
    }
    Ok((header, PREFIX + h_len))
}

/// The header of the file at `path` alone (for an index), read from its first bytes.
pub fn read_header(path: &Path, fingerprint: &str) -> Result<Header> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    read_header_from(&mut f, path, fingerprint)
}

/// The header of the open file `f`, leaving it positioned at the first array.
fn read_header_from(f: &mut std::fs::File, path: &Path, fingerprint: &str) -> Result<Header> {
    let mut head = vec![0u8; PREFIX];
    f.read_exact(&mut head)
        .map_err(|_| corrupt(path, "truncated: shorter than a state file's prefix"))?;
    let h_len = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    if PREFIX + h_len > file_len {
        return Err(corrupt(path, "truncated inside the header"));
    }
    let mut h = vec![0u8; h_len];
    f.read_exact(&mut h)
        .map_err(|_| corrupt(path, "truncated inside the header"))?;
    head.extend(h);
    parse_header(path, &head, fingerprint).map(|x| x.0)
}

/// Reads the file at `path` for a model whose fresh state is `template`: the header, then
/// each array straight into its own buffer (no copy of the file), checksums on every core.
pub fn read(path: &Path, fingerprint: &str, template: &SeqState) -> Result<Loaded> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = f.metadata().map_err(|e| Error::io(path, e))?.len() as usize;
    let header = read_header_from(&mut f, path, fingerprint)?;
    let want: Vec<ArrayInfo> = template.arrays().into_iter().map(|a| a.0).collect();
    let pos = header.ids.len();
    let shape_ok = header.arrays.len() == want.len()
        && header.arrays.iter().zip(&want).all(|(h, w)| {
            h.layer == w.layer
                && h.what == w.what
                && (matches!(h.what, ArrayKind::Rows) || h.len == w.len)
        });
    if !shape_ok || header.sums.len() != want.len() + usize::from(header.logits > 0) {
        return Err(refused(
            path,
            "written for a model of another shape (layers, state sizes): never loaded".into(),
        ));
    }
    let mut lens: Vec<usize> = header.arrays.iter().map(|a| a.len).collect();
    if header.logits > 0 {
        lens.push(header.logits);
    }
    let payload: usize = lens.iter().map(|n| 4 * n).sum();
    let at = f.stream_position().map_err(|e| Error::io(path, e))? as usize;
    if at + payload > file_len {
        return Err(corrupt(path, "truncated inside the arrays"));
    }
    if at + payload != file_len {
        return Err(corrupt(path, "trailing bytes after the arrays"));
    }
    let mut arrays = Vec::with_capacity(lens.len());
    for &n in &lens {
        let mut v = vec![0f32; n];
        f.read_exact(as_bytes_mut(&mut v))
            .map_err(|_| corrupt(path, "truncated inside the arrays"))?;
        arrays.push(v);
    }
    let ok = arrays
        .par_iter()
        .zip(&header.sums)
        .all(|(v, &s)| checksum(as_bytes(v)) == s);
    if !ok {
        return Err(corrupt(path, "array checksum mismatch"));
    }
    let logits = (header.logits > 0).then(|| arrays.pop()).flatten();
    let state = template.with_arrays(pos, arrays).ok_or_else(|| {
        refused(
            path,
            "its arrays do not fit this model's state (another shape)".into(),
        )
    })?;
    Ok(Loaded {
        header,
        state,
        logits,
    })
}
