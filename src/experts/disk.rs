//! The raw-span disk cache: one file per expert, `L{layer}-E{expert}.bin`, holding exactly the
//! expert's canonical span (no container). A file is trusted only when its size matches the span;
//! a wrong-sized file is deleted (with a warning) and reported as a miss. Files are published by
//! writing a temporary name, fsyncing and renaming, so a crash never leaves a partial file under
//! the name the cache looks at.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::fsio::{checksum, PooledBuf};
use crate::{Error, Result};

/// Whether to keep expert reads out of the OS page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheAdvice {
    /// Drop pages after each read on Linux (`posix_fadvise(DONTNEED)`); the default.
    Auto,
    /// Leave the page cache alone.
    Off,
}

/// Drops a file range from the page cache after it was read (Linux), so expert streaming does
/// not evict what the spine needs.
pub fn drop_from_page_cache(f: &File, start: u64, len: u64, advice: CacheAdvice) {
    if advice == CacheAdvice::Off {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open file descriptor and an in-range advisory call.
        unsafe {
            libc::posix_fadvise(
                f.as_raw_fd(),
                start as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_DONTNEED,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (f, start, len);
}

/// Marks a freshly opened file uncached where the OS does that per descriptor (macOS
/// `F_NOCACHE`); Linux uses `drop_from_page_cache` after each read instead.
pub fn no_cache_on_open(f: &File, advice: CacheAdvice) {
    #[cfg(target_os = "macos")]
    if advice == CacheAdvice::Auto {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid open file descriptor; F_NOCACHE only changes caching behaviour.
        unsafe {
            libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1);
        }
    }
    #[cfg(not(target_os = "macos"))]
    let _ = (f, advice);
}

/// Drops a whole file from the page cache (benchmarks use it to measure cold reads).
pub fn drop_from_page_cache_all(path: &Path) -> Result<()> {
    let f = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    drop_from_page_cache(&f, 0, len, CacheAdvice::Auto);
    Ok(())
}

/// The on-disk expert cache directory.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    advice: CacheAdvice,
    /// Verify every read against the checksum recorded at publish (`L{l}-E{e}.sum`, always
    /// written); a missing or wrong checksum is a miss (the file is deleted and refetched).
    pub verify: bool,
}

impl DiskCache {
    /// A cache rooted at `dir` (created if missing).
    pub fn new(dir: &Path, advice: CacheAdvice) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            advice,
            verify: false,
        })
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file of one expert.
    pub fn path(&self, layer: usize, expert: usize) -> PathBuf {
        self.dir.join(format!("L{layer}-E{expert}.bin"))
    }

    /// The checksum sidecar of one expert.
    pub fn sum_path(&self, layer: usize, expert: usize) -> PathBuf {
        self.dir.join(format!("L{layer}-E{expert}.sum"))
    }

    fn invalidate(&self, layer: usize, expert: usize) {
        let _ = std::fs::remove_file(self.path(layer, expert));
        let _ = std::fs::remove_file(self.sum_path(layer, expert));
    }

    /// Reads an expert into `buf` (whose length is the span's); `Ok(false)` when absent or
    /// invalid (invalid files are removed with a warning).
    pub fn read_into(&self, layer: usize, expert: usize, buf: &mut [u8]) -> Result<bool> {
        let Some((f, path)) = self.open_checked(layer, expert, buf.len())? else {
            return Ok(false);
        };
        f.read_exact_at(buf, 0).map_err(|e| Error::io(&path, e))?;
        drop_from_page_cache(&f, 0, buf.len() as u64, self.advice);
        Ok(self.verified(layer, expert, buf))
    }

    /// `read_into` a pooled buffer: on Linux with `CacheAdvice::Auto`, 1 MiB `O_DIRECT`
    /// requests straight into it (no page-cache copy; the buffer needs room for the length
    /// rounded up to 4 KiB), else the buffered read.
    pub fn read_into_pooled(
        &self,
        layer: usize,
        expert: usize,
        buf: &mut PooledBuf,
    ) -> Result<bool> {
        let len = buf.len();
        let Some((f, path)) = self.open_checked(layer, expert, len)? else {
            return Ok(false);
        };
        let direct = self.advice == CacheAdvice::Auto
            && crate::fsio::direct::read_head_serial(&path, &f, len, buf)?;
        if !direct {
            f.read_exact_at(buf, 0).map_err(|e| Error::io(&path, e))?;
            drop_from_page_cache(&f, 0, len as u64, self.advice);
        }
        Ok(self.verified(layer, expert, buf))
    }

    /// The expert's file opened, when it exists with the span's size (a wrong-sized one is
    /// deleted).
    fn open_checked(
        &self,
        layer: usize,
        expert: usize,
        len: usize,
    ) -> Result<Option<(File, PathBuf)>> {
        let path = self.path(layer, expert);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        no_cache_on_open(&f, self.advice);
        let size = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        if size != len as u64 {
            tracing::warn!(path = %path.display(), size, expected = len, "expert cache file has the wrong size; deleting it");
            self.invalidate(layer, expert);
            return Ok(None);
        }
        Ok(Some((f, path)))
    }

    /// Whether `bytes` pass the recorded checksum (always, when this cache does not verify); a
    /// failing or unchecked file is deleted.
    fn verified(&self, layer: usize, expert: usize, bytes: &[u8]) -> bool {
        if !self.verify {
            return true;
        }
        let want = std::fs::read_to_string(self.sum_path(layer, expert))
            .ok()
            .and_then(|t| u64::from_str_radix(t.trim(), 16).ok());
        if want == Some(checksum(bytes)) {
            return true;
        }
        let why = if want.is_some() {
            "fails its checksum"
        } else {
            "has no checksum"
        };
        tracing::warn!(path = %self.path(layer, expert).display(), "expert cache file {why}; deleting it");
        self.invalidate(layer, expert);
        false
    }

    /// Reads an expert of `len` bytes; `Ok(None)` when absent or invalid.
    pub fn read(&self, layer: usize, expert: usize, len: usize) -> Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; len];
        Ok(self.read_into(layer, expert, &mut buf)?.then_some(buf))
    }

    /// Publishes an expert's bytes atomically, checksum first, so a `.bin` is never visible
    /// without its checksum (whether or not this cache verifies reads).
    pub fn publish(&self, layer: usize, expert: usize, bytes: &[u8]) -> Result<()> {
        let sum = format!("{:016x}\n", checksum(bytes));
        self.write_atomic(&self.sum_path(layer, expert), sum.as_bytes())?;
        self.write_atomic(&self.path(layer, expert), bytes)
    }

    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        crate::fsio::atomic::write_atomic(path, bytes)
    }
}
