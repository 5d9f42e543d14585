//! Storage homes: extra directories, one per drive, holding raw expert spans in the disk cache's
//! format (`L{layer}-E{expert}.bin` + checksum). A home may be partial (e.g. the hottest experts
//! by router trace, `deltafin populate-home`). Each read goes to the home expected to finish
//! first: the bytes already queued on it plus this read, at its measured rate. Deltafin's
//! maintainers measured multi-drive reads as their largest lever (an M5 Max went from 0.55 to
//! 0.96 tok/s with 4 drives), since each layer waits for the slowest of its 16 reads.
//!
//! A home can be rate-limited (`emulated_rate`) so that one machine with one disk can test the
//! scheduling: the limit makes the home behave as a drive of that many bytes per second serving
//! its reads in order. Owns nothing of the other tiers; `tiered.rs` calls it before the disk
//! cache and the shards.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::disk::{CacheAdvice, DiskCache};
use crate::fsio::PooledBuf;
use crate::{Error, Result};

/// Rate assumed for a home before its first read completes (bytes/s).
const FIRST_RATE: f64 = 1e9;
/// Weight of the newest busy period in a home's rate estimate.
const RATE_WEIGHT: f64 = 0.3;

struct Queue {
    /// Bytes of reads started and not finished.
    queued: u64,
    /// Estimated rate (bytes/s): bytes served over each busy period (from the first read
    /// queued on an idle home until its queue is empty again), so reads a drive serves in
    /// parallel and finish together count as the throughput they were, not as instants.
    rate: f64,
    /// Emulation: when the emulated drive finishes what it has been given.
    free_at: Instant,
    /// When the current busy period began.
    busy_since: Instant,
    /// Bytes finished in the current busy period.
    busy_bytes: u64,
}

/// One storage home.
pub struct Home {
    cache: DiskCache,
    held: HashSet<(usize, usize)>,
    emulated_rate: Option<f64>,
    served: std::sync::atomic::AtomicU64,
}

impl Home {
    /// The home's directory.
    pub fn dir(&self) -> &Path {
        self.cache.dir()
    }

    /// Experts this home holds.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Experts this home has served.
    pub fn served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the home holds no expert.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The storage homes of an expert store.
pub struct Homes {
    homes: Vec<Home>,
    /// Every home's queue under one lock: choosing a home and queueing on it is one step, or
    /// a layer's 16 simultaneous reads would all see the same empty queues and pick one home.
    queues: Mutex<Vec<Queue>>,
}

impl Homes {
    /// Opens existing home directories (each must exist); `emulated_rate` (bytes/s) limits
    /// every home to that rate, for tests and `bench homes`.
    pub fn open(
        dirs: &[PathBuf],
        advice: CacheAdvice,
        verify: bool,
        emulated_rate: Option<f64>,
    ) -> Result<Homes> {
        let mut homes = Vec::new();
        let mut queues = Vec::new();
        for d in dirs {
            if !d.is_dir() {
                return Err(Error::Msg(format!(
                    "storage home {} does not exist: create it with `deltafin populate-home {}`",
                    d.display(),
                    d.display()
                )));
            }
            let mut cache = DiskCache::new(d, advice)?;
            cache.verify = verify;
            let held = cache.cached_experts().into_iter().collect();
            queues.push(Queue {
                queued: 0,
                rate: FIRST_RATE,
                free_at: Instant::now(),
                busy_since: Instant::now(),
                busy_bytes: 0,
            });
            homes.push(Home {
                cache,
                held,
                emulated_rate: emulated_rate.filter(|r| *r > 0.0),
                served: Default::default(),
            });
        }
        Ok(Homes {
            homes,
            queues: Mutex::new(queues),
        })
    }

    /// The homes, in the order given.
    pub fn homes(&self) -> &[Home] {
        &self.homes
    }

    /// Reads an expert into the pooled `buf` (its span's length) from the home expected to finish
    /// first (`DiskCache::read_into_pooled`);
    /// `Ok(false)` when no home holds it (or the file proved invalid and was removed).
    pub fn read_into(&self, layer: usize, expert: usize, buf: &mut PooledBuf) -> Result<bool> {
        let len = buf.len() as u64;
        let (pick, due) = {
            let mut qs = self.queues.lock().map_err(|_| poisoned())?;
            let mut best: Option<(f64, usize)> = None;
            for (i, (h, q)) in self.homes.iter().zip(qs.iter()).enumerate() {
                let eta = (q.queued + len) as f64 / q.rate;
                if h.held.contains(&(layer, expert)) && best.is_none_or(|(b, _)| eta < b) {
                    best = Some((eta, i));
                }
            }
            let Some((_, i)) = best else {
                return Ok(false);
            };
            let q = &mut qs[i];
            if q.queued == 0 {
                q.busy_since = Instant::now();
            }
            q.queued += len;
            let due = self.homes[i].emulated_rate.map(|r| {
                let start = q.free_at.max(Instant::now());
                q.free_at = start + Duration::from_secs_f64(len as f64 / r);
                q.free_at
            });
            (i, due)
        };
        let h = &self.homes[pick];
        let got = h.cache.read_into_pooled(layer, expert, buf);
        if let Some(due) = due {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let mut qs = self.queues.lock().map_err(|_| poisoned())?;
        let q = &mut qs[pick];
        q.queued -= len;
        q.busy_bytes += len;
        if q.queued == 0 {
            let secs = q.busy_since.elapsed().as_secs_f64().max(1e-6);
            q.rate = (1.0 - RATE_WEIGHT) * q.rate + RATE_WEIGHT * (q.busy_bytes as f64 / secs);
            q.busy_bytes = 0;
        }
        if matches!(got, Ok(true)) {
            h.served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        got
    }
}

fn poisoned() -> Error {
    Error::Msg("storage home lock poisoned".into())
}
