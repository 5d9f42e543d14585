//! Downloading shards for a full install: resumable, tied to the hub's ETag, and verified. The
//! partial file is named after the ETag (`<file>.<tag>.part`), so bytes of another upload are
//! never resumed into it; when the ETag is a content SHA-256 (the hub's LFS files) the whole
//! file is hashed as it is written (a resumed prefix is re-read and hashed first) and published
//! only if it matches. A shard already in place is kept only when `shards.json` says it was
//! downloaded from this ETag, or when its SHA-256 equals the ETag.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::checkpoint::source::{
    hex, hub_shards_path, is_sha256, sha256_file, sha256_hex, HubShard,
};
use crate::hub::HubRepo;
use crate::{Error, Result};

const CHUNK: u64 = 64 << 20;

/// The partial-download name of `file` for an ETag.
pub fn part_name(file: &str, etag: &str) -> String {
    format!("{file}.{}.part", &sha256_hex(etag.as_bytes())[..16])
}

/// Removes partial downloads of `file` for any other ETag (and the pre-ETag `<file>.part`).
fn sweep_parts(root: &Path, file: &str, keep: &str) {
    let (dir, base) = match Path::new(file).parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            (root.join(p), file.rsplit('/').next().unwrap_or(file))
        }
        _ => (root.to_path_buf(), file),
    };
    let keep = keep.rsplit('/').next().unwrap_or(keep);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = n
            .strip_prefix(base)
            .is_some_and(|r| r.starts_with('.') && r.ends_with(".part"));
        if ours && n != keep {
            tracing::warn!(
                "removing {} (a partial download of another upload)",
                e.path().display()
            );
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Records what the hub said about the shards now in place (`deltafin-meta/shards.json`).
pub fn write_hub_shards(root: &Path, shards: &BTreeMap<String, HubShard>) -> Result<()> {
    let json = serde_json::to_vec_pretty(shards).map_err(|e| Error::Msg(e.to_string()))?;
    crate::fsio::atomic::write_atomic(&hub_shards_path(root), &json)
}

/// Downloads one shard (or keeps the one in place) and returns what to record for it.
pub fn download_shard(
    hub: &HubRepo,
    root: &Path,
    file: &str,
    want: &HubShard,
    recorded: Option<&HubShard>,
    bar: &crate::progress::Bar,
) -> Result<HubShard> {
    let dest = root.join(file);
    let sha = is_sha256(&want.etag);
    let done = HubShard {
        verified: sha,
        ..want.clone()
    };
    if std::fs::metadata(&dest).map(|m| m.len()).ok() == Some(want.size) {
        if recorded.is_some_and(|r| r.etag == want.etag && r.size == want.size) {
            bar.inc(want.size);
            return Ok(recorded.cloned().unwrap_or(done));
        }
        if sha {
            // In place but unrecorded (an older install, or copied in): keep it if it is the
            // hub's file.
            if sha256_file(&dest, |n| bar.inc(n))? == want.etag {
                return Ok(done);
            }
            tracing::warn!(
                "{} differs from the hub's {}; downloading it again",
                dest.display(),
                want.etag
            );
            bar.set_position(bar.position().saturating_sub(want.size));
        } else {
            tracing::warn!(
                "{}: no record of which upload it came from; downloading it again",
                dest.display()
            );
        }
    }
    let part = root.join(part_name(file, &want.etag));
    sweep_parts(root, file, &part_name(file, &want.etag));
    let mut have = std::fs::metadata(&part)
        .map(|m| m.len())
        .unwrap_or(0)
        .min(want.size);
    let mut h = Sha256::new();
    if have > 0 && sha {
        // The resumed prefix counts toward the content hash.
        let mut f = std::fs::File::open(&part).map_err(|e| Error::io(&part, e))?;
        let mut buf = vec![0u8; 8 << 20];
        let mut left = have;
        while left > 0 {
            let n = (left as usize).min(buf.len());
            f.read_exact(&mut buf[..n])
                .map_err(|e| Error::io(&part, e))?;
            h.update(&buf[..n]);
            left -= n as u64;
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&part)
        .map_err(|e| Error::io(&part, e))?;
    f.set_len(have).map_err(|e| Error::io(&part, e))?;
    bar.inc(have);
    while have < want.size {
        let end = (have + CHUNK).min(want.size);
        let b = hub.fetch_range(file, have..end)?;
        f.write_all(&b).map_err(|e| Error::io(&part, e))?;
        if sha {
            h.update(&b);
        }
        have = end;
        bar.inc(b.len() as u64);
    }
    f.sync_all().map_err(|e| Error::io(&part, e))?;
    if sha {
        let got = hex(&h.finalize());
        if got != want.etag {
            let _ = std::fs::remove_file(&part);
            return Err(Error::Msg(format!(
                "{} does not match the hub's SHA-256 (ETag {}, got {got}); the partial file was removed: run setup again",
                hub.url(file),
                want.etag
            )));
        }
    }
    std::fs::rename(&part, &dest).map_err(|e| Error::io(&dest, e))?;
    crate::fsio::atomic::sync_parent(&dest)?;
    Ok(done)
}
