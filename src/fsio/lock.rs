//! One writer per model root: an advisory `flock` on `deltafin-meta/lock`, holding the writer's
//! pid, taken by `setup`, `fetch-experts` (and `warm-cache --fetch`) and the spine conversions. A
//! second process gets an error naming the holder's pid at once; inside one process the lock is
//! shared (a conversion inside `setup` does not lock against itself). Readers (`run`, `serve`)
//! never take it: every file they may publish is written atomically under a unique name.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::{Error, Result};

struct Held {
    _file: File,
}

/// The lock of one model root, released when the last guard in this process drops.
pub struct RootLock {
    _held: Arc<Held>,
}

fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Held>>> {
    static R: OnceLock<Mutex<HashMap<PathBuf, Weak<Held>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The lock file of `root`.
pub fn lock_path(root: &Path) -> PathBuf {
    root.join("deltafin-meta").join("lock")
}

impl RootLock {
    /// Takes the lock of `root`, or fails naming the process that holds it.
    pub fn acquire(root: &Path) -> Result<RootLock> {
        let path = lock_path(root);
        let dir = path.parent().unwrap_or(root);
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let mut reg = registry()
            .lock()
            .map_err(|_| Error::Msg("lock registry poisoned".into()))?;
        if let Some(h) = reg.get(&key).and_then(|w| w.upgrade()) {
            return Ok(RootLock { _held: h });
        }
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        // SAFETY: a valid open descriptor; flock only takes an advisory lock on it.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            return Err(Error::Msg(format!(
                "{} is being written by another deltafin process (pid {}, lock {}): wait for it to finish or stop it, then run this again",
                root.display(),
                pid.trim(),
                path.display()
            )));
        }
        let id = std::process::id().to_string();
        let _ = f.set_len(0);
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.write_all(id.as_bytes());
        let held = Arc::new(Held { _file: f });
        reg.insert(key, Arc::downgrade(&held));
        Ok(RootLock { _held: held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_process_is_refused_naming_the_holder() {
        let d = tempfile::tempdir().unwrap();
        let a = RootLock::acquire(d.path()).unwrap();
        // The same process shares it.
        let b = RootLock::acquire(d.path()).unwrap();
        drop(b);
        // Another open file description (what another process has) is refused while held.
        let f = File::open(lock_path(d.path())).unwrap();
        // SAFETY: a valid descriptor.
        let busy = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0;
        assert!(busy);
        let pid = std::fs::read_to_string(lock_path(d.path())).unwrap();
        assert_eq!(pid, std::process::id().to_string());
        drop(a);
        // SAFETY: as above.
        let free = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        assert!(free, "released when the last guard drops");
    }
}
