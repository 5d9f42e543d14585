//! Publishing files atomically: write to a temporary name unique to this process and call
//! (`.<name>.<pid>.<n>.tmp` in the same directory, created exclusively), fsync it, rename it over
//! the destination, then fsync the directory so the rename itself survives a crash. Two writers
//! never share a temporary file, and a reader sees the old file or the whole new one.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{Error, Result};

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A temporary path next to `path`, unique to this process and call.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "file".into());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// Whether `name` is one of this module's temporary names (for sweeping after a crash).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Removes the temporaries in `dir` left by processes that no longer run (a crash mid-write);
/// those of live processes are theirs. Returns what was removed.
pub fn sweep(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut gone = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_temp_name(&name) {
            continue;
        }
        // `.<name>.<pid>.<n>.tmp`: the pid is the second-to-last dot field before `tmp`.
        let fields: Vec<&str> = name.rsplitn(4, '.').collect();
        let pid = fields.get(2).and_then(|p| p.parse::<i32>().ok());
        let alive = match pid {
            Some(p) if p > 0 => {
                // SAFETY: signal 0 only checks that the process exists.
                let exists = unsafe { libc::kill(p, 0) } == 0;
                exists || p as u32 == std::process::id()
            }
            _ => false,
        };
        if !alive && std::fs::remove_file(e.path()).is_ok() {
            gone.push(e.path());
        }
    }
    gone
}

/// Fsyncs the directory holding `path`, so a rename into it is durable.
pub fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes).map_err(|e| Error::io(path, e)))
}

/// Writes a file atomically through a callback that fills a buffered writer.
pub fn write_atomic_with(
    path: &Path,
    f: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    let tmp = temp_path(path);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| Error::io(&tmp, e))?;
    let mut w = BufWriter::with_capacity(8 << 20, file);
    let res = f(&mut w).and_then(|_| {
        let file = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))
    });
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(path, e));
    }
    sync_parent(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concurrent_writers_never_share_a_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f.bin");
        std::thread::scope(|s| {
            for k in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(p, &vec![k; 100_000]).unwrap();
                    }
                });
            }
        });
        // Whoever won, the file is one writer's whole content, and no temporary is left.
        let b = std::fs::read(&p).unwrap();
        assert_eq!(b.len(), 100_000);
        assert!(b.iter().all(|&x| x == b[0]));
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["f.bin".to_string()]);
        assert!(is_temp_name(
            &temp_path(&p).file_name().unwrap().to_string_lossy()
        ));
    }

    #[test]
    fn sweep_removes_only_dead_writers_temporaries() {
        let d = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = d.path().join(format!(".a.bin.{dead}.3.tmp"));
        let mine = temp_path(&d.path().join("b.bin"));
        std::fs::write(&stale, b"x").unwrap();
        std::fs::write(&mine, b"y").unwrap();
        std::fs::write(d.path().join("c.bin"), b"z").unwrap();
        assert_eq!(sweep(d.path()), vec![stale.clone()]);
        assert!(!stale.exists() && mine.exists() && d.path().join("c.bin").exists());
    }
}
