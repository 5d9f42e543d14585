//! Files and buffers under everything else: atomic publishing (`atomic`), page-aligned pooled
//! buffers (`buf`), the one-writer-per-root lock (`lock`), the cache checksum and the free-space
//! query. Knows nothing of models, checkpoints or devices; every other module may use it.

use std::path::Path;

pub mod atomic;
pub mod buf;
pub mod direct;
pub mod lock;

pub use buf::{AlignedBuf, BufPool, PooledBuf, ALIGN};
pub use lock::RootLock;

/// A fast 64-bit checksum of a byte string (not cryptographic): detects corrupted cache files.
pub fn checksum(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15 ^ bytes.len() as u64;
    let mut it = bytes.chunks_exact(8);
    for w in &mut it {
        let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        h = (h ^ v).wrapping_mul(0x100_0000_01B3).rotate_left(29);
    }
    for &b in it.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01B3);
    }
    h ^ (h >> 31)
}

static FREE_OVERRIDE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Makes `free_bytes` report `bytes` for every filesystem, for the rest of the process (the
/// binary sets it from `DELTAFIN_DISK_FREE`, for tests). The first call wins.
pub fn override_free_bytes(bytes: u64) {
    let _ = FREE_OVERRIDE.set(bytes);
}

/// Free bytes on the filesystem of `path` (`override_free_bytes` overrides; 0 when unknown).
pub fn free_bytes(path: &Path) -> u64 {
    if let Some(&v) = FREE_OVERRIDE.get() {
        return v;
    }
    fs_free(path).unwrap_or(0)
}

/// Free bytes on the filesystem of `path` for an unprivileged user (`statvfs`), if known.
pub fn fs_free(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a valid NUL-terminated path and a zeroed out-parameter.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statvfs(c.as_ptr(), &mut s) } == 0)
        .then(|| s.f_bavail as u64 * s.f_frsize as u64)
}

/// Maps `f` (at `path`) read-only for random access (`MADV_RANDOM`: a fault reads its own pages,
/// not a read-ahead window; 2,048 random K3 embedding rows left 183 MB resident without it, 63 MB
/// with it). Sound as long as nobody writes the file in place: every file this crate publishes is
/// written under a temporary name and renamed, so a mapping keeps the old inode's bytes.
pub fn map_random(f: &std::fs::File, path: &Path) -> crate::Result<memmap2::Mmap> {
    // SAFETY: see above; the mapping is read-only.
    let map = unsafe { memmap2::Mmap::map(f) }.map_err(|e| crate::Error::io(path, e))?;
    map.advise(memmap2::Advice::Random)
        .map_err(|e| crate::Error::io(path, e))?;
    Ok(map)
}
