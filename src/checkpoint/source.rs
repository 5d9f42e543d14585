//! Where a checkpoint's bytes come from: each shard's identity (size, SHA-256 of its header, and
//! the hub's ETag when an install recorded one) and a fingerprint over all of them. Everything
//! derived from a checkpoint (the spine store, the expert cache, the install manifest) records
//! the fingerprint or the shard identities it was built from, so a re-upload or a re-run of
//! `setup` at another revision is noticed instead of mixing bytes of two checkpoints.
//!
//! The hub's ETag of an LFS file is the SHA-256 of its content; without one (a local
//! checkpoint), a shard is identified by its size and header, which catches any change of layout
//! but not a same-layout change of values. This module reads `deltafin-meta/shards.json`, which
//! `setup` writes; it never writes checkpoint files itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::io::Read;

use sha2::{Digest, Sha256};

use super::Inventory;
use crate::{Error, Result};

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 of a whole file (hex), read sequentially.
pub fn sha256_file(path: &Path, mut progress: impl FnMut(u64)) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        progress(n as u64);
    }
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of a byte string.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Whether an ETag is a content SHA-256 (what the hub gives for LFS files): 64 hex digits.
pub fn is_sha256(etag: &str) -> bool {
    etag.len() == 64 && etag.bytes().all(|c| c.is_ascii_hexdigit())
}

/// What the hub said about one shard when it was installed (`deltafin-meta/shards.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HubShard {
    /// File size the hub reported.
    pub size: u64,
    /// The hub's ETag (normalised: no quotes, no weak prefix).
    pub etag: String,
    /// Whether the local file's SHA-256 was checked against the ETag (full installs).
    #[serde(default)]
    pub verified: bool,
}

/// Where `setup` records what the hub said about each shard.
pub fn hub_shards_path(root: &Path) -> PathBuf {
    root.join("deltafin-meta").join("shards.json")
}

/// The hub's record of each shard of the install at `root` (empty for a plain checkpoint or an
/// unreadable record: the shards are then identified by size and header only).
pub fn read_hub_shards(root: &Path) -> BTreeMap<String, HubShard> {
    std::fs::read(hub_shards_path(root))
        .ok()
        .and_then(|b| parse_hub_shards(&b))
        .unwrap_or_default()
}

/// Parses a `shards.json` record (`None` if it is not one).
pub fn parse_hub_shards(bytes: &[u8]) -> Option<BTreeMap<String, HubShard>> {
    serde_json::from_slice(bytes).ok()
}

/// The identity of one shard.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardSource {
    /// File size.
    pub size: u64,
    /// SHA-256 of the JSON header.
    pub header_sha256: String,
    /// The hub's ETag (content SHA-256 for LFS files), when the install recorded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

impl ShardSource {
    /// A short id of this shard's identity (hex).
    pub fn id(&self) -> String {
        let s = format!(
            "{}\n{}\n{}",
            self.size,
            self.header_sha256,
            self.etag.as_deref().unwrap_or("")
        );
        sha256_hex(s.as_bytes())[..32].to_string()
    }
}

/// The identity of a whole checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// Each shard by file name.
    pub shards: BTreeMap<String, ShardSource>,
}

impl Source {
    /// The source of the checkpoint `inv` describes, with the hub's ETags recorded at
    /// `inv.dir` (only those whose size matches the shard).
    pub fn of(inv: &Inventory) -> Source {
        let hub = read_hub_shards(&inv.dir);
        let shards = inv
            .shards
            .iter()
            .map(|s| {
                let etag = hub
                    .get(&s.file)
                    .filter(|h| h.size == s.size)
                    .map(|h| h.etag.clone());
                (
                    s.file.clone(),
                    ShardSource {
                        size: s.size,
                        header_sha256: s.header_sha256.clone(),
                        etag,
                    },
                )
            })
            .collect();
        Source { shards }
    }

    /// A fingerprint over every shard's name and identity (hex, 32 digits).
    pub fn fingerprint(&self) -> String {
        let mut h = Sha256::new();
        for (name, s) in &self.shards {
            h.update(name.as_bytes());
            h.update(b"\n");
            h.update(s.id().as_bytes());
            h.update(b"\n");
        }
        hex(&h.finalize())[..32].to_string()
    }

    /// Each shard's id by name (what an expert cache records).
    pub fn shard_ids(&self) -> BTreeMap<String, String> {
        self.shards
            .iter()
            .map(|(n, s)| (n.clone(), s.id()))
            .collect()
    }
}

/// Parses a JSON object of string values (a recorded `shard_ids` map) from `path`.
pub fn read_ids(path: &Path) -> Result<Option<BTreeMap<String, String>>> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::Json {
                path: path.to_path_buf(),
                source: e,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// Parses a recorded `shard_ids` map (`path` names it in errors).
pub fn parse_ids(bytes: &[u8], path: &Path) -> Result<BTreeMap<String, String>> {
    serde_json::from_slice(bytes).map_err(|e| Error::Json {
        path: path.to_path_buf(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_abc_is_the_standard_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(is_sha256(&sha256_hex(b"")));
        assert!(!is_sha256("\"abc\""));
    }

    #[test]
    fn fingerprint_changes_with_any_part_of_any_shard() {
        let shard = |size, h: &str, e: Option<&str>| ShardSource {
            size,
            header_sha256: h.into(),
            etag: e.map(String::from),
        };
        let base = Source {
            shards: [("a".to_string(), shard(10, "h", Some("e")))].into(),
        };
        let fp = base.fingerprint();
        for other in [
            shard(11, "h", Some("e")),
            shard(10, "g", Some("e")),
            shard(10, "h", Some("f")),
            shard(10, "h", None),
        ] {
            let s = Source {
                shards: [("a".to_string(), other)].into(),
            };
            assert_ne!(s.fingerprint(), fp);
        }
        let renamed = Source {
            shards: [("b".to_string(), shard(10, "h", Some("e")))].into(),
        };
        assert_ne!(renamed.fingerprint(), fp);
        assert_eq!(base.clone().fingerprint(), fp);
    }
}
