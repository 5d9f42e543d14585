//! The prompt cache: sequence states saved at the positions where requests diverge (the end
//! of each chat message, the end of a prompt, every `every` tokens of a long prompt, the end of
//! a reply), so a request resumes from the entry with the longest prefix of its ids and
//! prefills only the rest. Entries live in RAM (least recently used evicted first, by bytes,
//! buffers shared between snapshots counted once) and, with a directory, on disk too: each
//! entry is written through when it is made (so a restart finds it), and the directory is kept
//! within its own budget, least recently used first. Files from another checkpoint, format or
//! shape are refused and left alone; truncated or damaged ones are removed, never loaded.
//!
//! Owns the entries and their files; must not run the model (the engine's `prefill` does).

mod cuts;
pub mod file;

pub use cuts::cut_points;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::runtime::state::SeqState;
use crate::{Error, Result};

/// How big the cache may grow and where it keeps its files.
#[derive(Debug, Clone)]
pub struct PromptCacheOptions {
    /// RAM the entries may hold (the memory plan's line).
    pub ram_bytes: u64,
    /// Directory for entries on disk (`--prompt-cache DIR`); none keeps them in RAM only.
    pub dir: Option<PathBuf>,
    /// Bytes the directory may hold.
    pub disk_bytes: u64,
    /// A long prompt is cut every this many tokens (0: never) to save an entry there.
    pub every: usize,
}

impl Default for PromptCacheOptions {
    fn default() -> Self {
        PromptCacheOptions {
            ram_bytes: 1 << 30,
            dir: None,
            disk_bytes: 64 << 30,
            every: 2048,
        }
    }
}

/// What the cache did so far.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CacheStats {
    /// Requests looked up.
    pub lookups: u64,
    /// Lookups that resumed from an entry.
    pub hits: u64,
    /// Of those, from a file.
    pub disk_hits: u64,
    /// Prompt tokens not prefilled thanks to the hits.
    pub tokens_saved: u64,
    /// Entries in RAM and the bytes they hold.
    pub ram_entries: usize,
    /// Bytes the RAM entries hold (shared buffers once).
    pub ram_bytes: u64,
    /// Entries on disk and the bytes of their files.
    pub disk_entries: usize,
    /// Bytes of the files.
    pub disk_bytes: u64,
    /// Files removed as truncated or damaged.
    pub removed_corrupt: u64,
    /// Files refused as another checkpoint's, format's or shape's.
    pub refused: u64,
}

/// Where a request starts: a state holding `start` of its tokens, and the last position's
/// logits when the entry holds every token of the request.
pub struct Resume {
    /// The state (a copy-on-write snapshot of the entry's).
    pub state: SeqState,
    /// Tokens of the request it holds.
    pub start: usize,
    /// The logits after them, when `start` is the request's whole length.
    pub logits: Option<Vec<f32>>,
}

struct Entry {
    ids: Vec<u32>,
    state: SeqState,
    logits: Option<Vec<f32>>,
    used: u64,
}

struct DiskEntry {
    ids: Vec<u32>,
    path: PathBuf,
    bytes: u64,
    has_logits: bool,
    used: u64,
}

#[derive(Default)]
struct Inner {
    ram: Vec<Entry>,
    disk: Vec<DiskEntry>,
    tick: u64,
    stats: CacheStats,
}

/// The cache of one model (its checkpoint's fingerprint keys the files).
pub struct PromptCache {
    opts: PromptCacheOptions,
    fingerprint: String,
    /// A fresh state of the model: the layout files are checked against.
    template: SeqState,
    inner: Mutex<Inner>,
}

/// The file name of the entry holding `ids`.
fn file_name(ids: &[u32]) -> String {
    let mut h = Sha256::new();
    for i in ids {
        h.update(i.to_le_bytes());
    }
    let d = h.finalize();
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{hex}.dfstate")
}

/// Length of the common prefix.
fn common(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// An entry with `len` ids and `logits` serves a request of `ids` when it holds a prefix of it
/// and leaves at least one token to feed, or holds all of it with the logits.
fn serves(entry: &[u32], has_logits: bool, ids: &[u32]) -> bool {
    let n = entry.len();
    n > 0 && common(entry, ids) == n && (n < ids.len() || has_logits && n == ids.len())
}

impl PromptCache {
    /// A cache for the model whose checkpoint has `fingerprint` and whose fresh state is
    /// `template`; with a directory, indexes the files already there (refusing foreign ones,
    /// removing damaged ones).
    pub fn new(opts: PromptCacheOptions, fingerprint: String, template: SeqState) -> Result<Self> {
        let cache = PromptCache {
            opts,
            fingerprint,
            template,
            inner: Mutex::new(Inner::default()),
        };
        if let Some(dir) = &cache.opts.dir {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            crate::fsio::atomic::sweep(dir);
            cache.index(dir)?;
        }
        Ok(cache)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| Error::Msg("prompt cache lock poisoned".into()))
    }

    /// Reads the header of every state file in `dir` (oldest first, so the newest are kept
    /// longest).
    fn index(&self, dir: &Path) -> Result<()> {
        let mut files: Vec<(std::time::SystemTime, PathBuf, u64)> = Vec::new();
        for e in std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .flatten()
        {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "dfstate") {
                if let Ok(m) = e.metadata() {
                    let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    files.push((t, p, m.len()));
                }
            }
        }
        files.sort();
        let mut g = self.lock()?;
        for (_, path, bytes) in files {
            match file::read_header(&path, &self.fingerprint) {
                Ok(h) => {
                    g.tick += 1;
                    let used = g.tick;
                    g.disk.push(DiskEntry {
                        ids: h.ids,
                        path,
                        bytes,
                        has_logits: h.logits > 0,
                        used,
                    });
                }
                Err(e) => Self::reject(&mut g, &path, &e),
            }
        }
        Ok(())
    }

    /// Counts and reports a file that cannot be used; removes it when damaged.
    fn reject(g: &mut Inner, path: &Path, e: &Error) {
        match e {
            Error::StateFile { corrupt: true, .. } => {
                tracing::warn!("prompt cache: {e}; removed");
                let _ = std::fs::remove_file(path);
                g.stats.removed_corrupt += 1;
            }
            _ => {
                tracing::warn!("prompt cache: {e}; refused (left in place)");
                g.stats.refused += 1;
            }
        }
    }

    /// The entry with the longest prefix of `ids` (RAM first, then disk at equal length), as a
    /// state to resume from; `None` when nothing serves.
    pub fn lookup(&self, ids: &[u32]) -> Result<Option<Resume>> {
        let mut g = self.lock()?;
        g.stats.lookups += 1;
        g.tick += 1;
        let tick = g.tick;
        let best_ram = g
            .ram
            .iter()
            .enumerate()
            .filter(|(_, e)| serves(&e.ids, e.logits.is_some(), ids))
            .max_by_key(|(_, e)| e.ids.len())
            .map(|(i, e)| (i, e.ids.len()));
        // The longest disk entry first; one found damaged is removed (and logged) and the next
        // longest tried, so a request never loses an intact shorter entry to a damaged one.
        loop {
            let best_disk = g
                .disk
                .iter()
                .enumerate()
                .filter(|(_, e)| serves(&e.ids, e.has_logits, ids))
                .max_by_key(|(_, e)| e.ids.len())
                .map(|(i, e)| (i, e.ids.len()));
            let ram_len = best_ram.map_or(0, |b| b.1);
            let Some((i, n)) = best_disk.filter(|d| d.1 > ram_len) else {
                break;
            };
            let path = g.disk[i].path.clone();
            match file::read(&path, &self.fingerprint, &self.template) {
                Ok(l) if l.header.ids == g.disk[i].ids => {
                    g.disk[i].used = tick;
                    g.stats.hits += 1;
                    g.stats.disk_hits += 1;
                    g.stats.tokens_saved += n as u64;
                    let r = Resume {
                        state: l.state.snapshot(),
                        start: n,
                        logits: (n == ids.len()).then(|| l.logits.clone()).flatten(),
                    };
                    self.admit(&mut g, l.header.ids, l.state, l.logits);
                    return Ok(Some(r));
                }
                Ok(_) => {
                    let e = Error::StateFile {
                        path: path.clone(),
                        corrupt: true,
                        msg: "its ids changed since it was indexed".into(),
                    };
                    Self::reject(&mut g, &path, &e);
                    g.disk.remove(i);
                }
                Err(e) => {
                    Self::reject(&mut g, &path, &e);
                    g.disk.remove(i);
                }
            }
        }
        let Some((i, n)) = best_ram else {
            return Ok(None);
        };
        let e = &mut g.ram[i];
        e.used = tick;
        let r = Resume {
            state: e.state.snapshot(),
            start: n,
            logits: (n == ids.len()).then(|| e.logits.clone()).flatten(),
        };
        g.stats.hits += 1;
        g.stats.tokens_saved += n as u64;
        Ok(Some(r))
    }

    /// Saves `state`, which holds `ids` (and, if given, the logits after them): in RAM, and
    /// written through to the directory. Replaces an entry with the same ids.
    pub fn insert(&self, ids: &[u32], state: &SeqState, logits: Option<&[f32]>) -> Result<()> {
        if ids.is_empty() || state.pos != ids.len() {
            return Ok(());
        }
        let write = match &self.opts.dir {
            Some(dir) => {
                let g = self.lock()?;
                let known = g
                    .disk
                    .iter()
                    .any(|d| d.ids == ids && (d.has_logits || logits.is_none()));
                (!known).then(|| dir.join(file_name(ids)))
            }
            None => None,
        };
        // The file is written outside the lock: a lookup never waits behind a save.
        let written = match write {
            Some(path) => {
                let bytes = file::write(
                    &path,
                    &self.fingerprint,
                    ids,
                    state,
                    logits,
                    serde_json::Value::Null,
                )?;
                Some((path, bytes))
            }
            None => None,
        };
        let mut g = self.lock()?;
        if let Some((path, bytes)) = written {
            self.record_file(&mut g, ids, path, bytes, logits.is_some());
        }
        self.admit(
            &mut g,
            ids.to_vec(),
            state.snapshot(),
            logits.map(<[f32]>::to_vec),
        );
        Ok(())
    }

    /// Indexes a file just written and trims the directory to its budget.
    fn record_file(&self, g: &mut Inner, ids: &[u32], path: PathBuf, bytes: u64, has_logits: bool) {
        g.disk.retain(|d| d.path != path);
        g.tick += 1;
        let used = g.tick;
        g.disk.push(DiskEntry {
            ids: ids.to_vec(),
            path,
            bytes,
            has_logits,
            used,
        });
        while g.disk.iter().map(|d| d.bytes).sum::<u64>() > self.opts.disk_bytes && g.disk.len() > 1
        {
            let Some(old) = (0..g.disk.len()).min_by_key(|&i| g.disk[i].used) else {
                break;
            };
            let d = g.disk.remove(old);
            let _ = std::fs::remove_file(&d.path);
        }
    }

    /// Puts an entry in RAM (replacing one with the same ids) and evicts the least recently
    /// used until the entries fit the budget.
    fn admit(&self, g: &mut Inner, ids: Vec<u32>, state: SeqState, logits: Option<Vec<f32>>) {
        g.ram.retain(|e| e.ids != ids);
        g.tick += 1;
        let used = g.tick;
        g.ram.push(Entry {
            ids,
            state,
            logits,
            used,
        });
        while Self::ram_bytes(&g.ram) > self.opts.ram_bytes && !g.ram.is_empty() {
            let Some(old) = (0..g.ram.len()).min_by_key(|&i| g.ram[i].used) else {
                break;
            };
            g.ram.remove(old);
        }
    }

    fn ram_bytes(ram: &[Entry]) -> u64 {
        let mut seen = HashSet::new();
        ram.iter()
            .map(|e| {
                e.state.unique_bytes(&mut seen)
                    + 4 * e.logits.as_ref().map_or(0, |l| l.len()) as u64
            })
            .sum()
    }

    /// A long prompt is cut every this many tokens.
    pub fn every(&self) -> usize {
        self.opts.every
    }

    /// Hits, savings and holdings so far.
    pub fn stats(&self) -> CacheStats {
        let Ok(g) = self.lock() else {
            return CacheStats::default();
        };
        let mut s = g.stats.clone();
        s.ram_entries = g.ram.len();
        s.ram_bytes = Self::ram_bytes(&g.ram);
        s.disk_entries = g.disk.len();
        s.disk_bytes = g.disk.iter().map(|d| d.bytes).sum();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_serving_prefix() {
        assert!(serves(&[1, 2], false, &[1, 2, 3]));
        assert!(
            !serves(&[1, 2, 3], false, &[1, 2, 3]),
            "nothing left to feed, no logits"
        );
        assert!(serves(&[1, 2, 3], true, &[1, 2, 3]));
        assert!(!serves(&[1, 4], true, &[1, 2, 3]));
        assert!(!serves(&[], true, &[1]));
    }
}
