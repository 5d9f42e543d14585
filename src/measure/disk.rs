//! Storage read rates measured in the same run as the work they bound: raw `O_DIRECT` reads
//! (sequential, or expert-sized jobs over parallel readers), the buffered read of a shard, and
//! an observer that drops a model's files from the page cache at every pass (cold runs). Owns
//! these measurements; never reads a model's weights for use.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use crate::runtime::observe::{Event, Observer};
use crate::{Error, Result};

/// Sequential O_DIRECT read of `[start, end)` of `path` in 16 MiB requests; returns GB/s.
pub fn raw_read(path: &Path, start: u64, end: u64) -> Result<f64> {
    const CHUNK: usize = 16 << 20;
    let f = open_direct(path)?;
    let mut buf = crate::fsio::AlignedBuf::new(CHUNK)?;
    let (a, b) = (start & !4095, end.div_ceil(4096) * 4096);
    let t0 = Instant::now();
    let mut off = a;
    let mut total = 0u64;
    while off < b {
        let n = f
            .read_at(&mut buf[..], off)
            .map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        off += n as u64;
    }
    Ok(total as f64 / 1e9 / t0.elapsed().as_secs_f64())
}

/// Reads each job's parts (`(file index in paths, [(start, len)])`, e.g. one expert each) with
/// `r` threads, `O_DIRECT`, job `k` on thread `k % r`; returns when all are read.
pub fn raw_read_jobs(
    paths: &[std::path::PathBuf],
    jobs: &[(usize, Vec<(u64, u64)>)],
    r: usize,
) -> Result<()> {
    const CHUNK: usize = 16 << 20;
    let r = r.clamp(1, jobs.len().max(1));
    std::thread::scope(|sc| -> Result<()> {
        let hs: Vec<_> = (0..r)
            .map(|t| {
                sc.spawn(move || -> Result<()> {
                    let mut buf = crate::fsio::AlignedBuf::new(CHUNK)?;
                    let mut open: Option<(usize, std::fs::File)> = None;
                    for (shard, parts) in jobs.iter().skip(t).step_by(r) {
                        if open.as_ref().is_none_or(|(s, _)| s != shard) {
                            let p = paths
                                .get(*shard)
                                .ok_or_else(|| Error::Msg(format!("raw read: no file {shard}")))?;
                            open = Some((*shard, open_direct(p)?));
                        }
                        let Some((_, f)) = &open else { continue };
                        for &(start, len) in parts {
                            let (mut off, end) =
                                (start & !4095, (start + len).div_ceil(4096) * 4096);
                            while off < end {
                                let n = ((end - off) as usize).min(CHUNK);
                                let got = f
                                    .read_at(&mut buf[..n], off)
                                    .map_err(|e| Error::io(&paths[*shard], e))?;
                                if got == 0 {
                                    break;
                                }
                                off += got as u64;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| Error::Msg("a raw reader panicked".into()))??;
        }
        Ok(())
    })
}

/// Opens a file for reads that bypass the page cache (`O_DIRECT` on Linux, `F_NOCACHE` on
/// macOS).
fn open_direct(path: &Path) -> Result<std::fs::File> {
    #[cfg(target_os = "linux")]
    let flags = libc::O_DIRECT;
    #[cfg(not(target_os = "linux"))]
    let flags = 0;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    crate::experts::disk::no_cache_on_open(&f, crate::experts::CacheAdvice::Auto);
    Ok(f)
}

/// Drops every file of a model directory from the page cache at the start of each pass.
pub struct ColdFiles(pub Vec<std::path::PathBuf>);

impl ColdFiles {
    /// Makes every pass of `model` start with `root`'s files out of the page cache.
    pub fn observe(model: &mut dyn crate::Model, root: &Path) -> Result<()> {
        let mut files = Vec::new();
        files_under(root, &mut files)?;
        model.observe(std::sync::Arc::new(ColdFiles(files)));
        Ok(())
    }
}

impl Observer for ColdFiles {
    fn on(&self, _layer: usize, event: &Event<'_>) {
        if matches!(event, Event::PassStart { .. }) {
            for p in &self.0 {
                let _ = crate::experts::disk::drop_from_page_cache_all(p);
            }
        }
    }
}

/// Every file under `dir`, recursively, appended to `out`.
pub fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let p = e.map_err(|e| Error::io(dir, e))?.path();
        if p.is_dir() {
            files_under(&p, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

/// Buffered read rate of `bytes` from the model's shards, the way the spine and experts are
/// read (positioned reads into one reused buffer, 2 threads), after dropping the page cache.
pub fn shard_read_gbps(root: &Path, bytes: u64) -> Result<f64> {
    let inv = crate::checkpoint::Inventory::from_dir(root)?;
    let mut files: Vec<(std::path::PathBuf, u64)> = inv
        .shards
        .iter()
        .map(|s| {
            let p = root.join(&s.file);
            let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            (p, len)
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.1));
    let (path, len) = files
        .first()
        .cloned()
        .ok_or_else(|| Error::Msg("no shards".into()))?;
    let span = bytes.min(len);
    let f = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
    crate::experts::disk::drop_from_page_cache(&f, 0, len, crate::experts::CacheAdvice::Auto);
    let threads = 2u64;
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let (f, path) = (&f, &path);
                s.spawn(move || -> Result<()> {
                    use std::os::unix::fs::FileExt;
                    let mut buf = vec![0u8; 64 << 20];
                    let (a, b) = (span * k / threads, span * (k + 1) / threads);
                    let mut off = a;
                    while off < b {
                        let n = ((b - off) as usize).min(buf.len());
                        f.read_exact_at(&mut buf[..n], off)
                            .map_err(|e| Error::io(path, e))?;
                        off += n as u64;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| Error::Msg("reader panicked".into()))??;
        }
        Ok(())
    })?;
    let gbps = span as f64 / 1e9 / t0.elapsed().as_secs_f64();
    crate::experts::disk::drop_from_page_cache(&f, 0, len, crate::experts::CacheAdvice::Auto);
    Ok(gbps)
}
