//! Bounded prefetch for `TieredExperts`. Hints are the experts the last position of the
//! previous pass chose (never a prefill chunk's union); they queue in layer order and dedicated
//! threads read them while the bytes held (reading + ready) stay under a cap. A new token drops
//! every stale hint and unused read, a demand read takes a queued hint over instead of waiting
//! behind it, and reaching layer L drops what was prefetched for layers before L. Demand reads
//! run on their own pool, so they never queue behind prefetch work.
//!
//! Owns the prefetch queue and its threads; must not touch the RAM tier's policy.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use super::ram::ExpertKey;
use super::tiered::{Inner, Read};
use crate::Result;

/// State shared by the prefetch threads and demand reads.
#[derive(Default)]
pub(crate) struct Prefetches {
    /// Bumped at every token: reads of an older generation are discarded.
    generation: u64,
    /// Hints not yet started, in layer order.
    queue: VecDeque<ExpertKey>,
    /// Being read.
    running: HashSet<ExpertKey>,
    /// Read and waiting for the demand fetch.
    ready: HashMap<ExpertKey, Read>,
    /// Bytes of `running` + `ready`.
    held: u64,
    /// Most bytes ever held.
    pub(crate) peak: u64,
    shutdown: bool,
}

/// The prefetch queue with its condition variable.
#[derive(Default)]
pub(crate) struct Prefetcher {
    pub(crate) state: Mutex<Prefetches>,
    changed: Condvar,
}

/// What a demand read finds for one expert.
pub(crate) enum Found {
    /// A finished prefetch.
    Ready(Read),
    /// Nothing: the demand path reads it.
    Absent,
}

impl Prefetcher {
    /// Starts `threads` prefetch threads over `inner`.
    pub(crate) fn start(inner: &Arc<Inner>, threads: usize) {
        for i in 0..threads {
            let me = inner.clone();
            let _ = std::thread::Builder::new()
                .name(format!("expert-prefetch-{i}"))
                .spawn(move || worker(&me));
        }
    }

    /// A new token: drops queued hints and unused reads, then queues `hints` (in order).
    pub(crate) fn restart(&self, hints: Vec<ExpertKey>, len: impl Fn(ExpertKey) -> u64) {
        let Ok(mut p) = self.state.lock() else { return };
        p.generation += 1;
        p.queue.clear();
        let dropped: u64 = p.ready.keys().map(|&k| len(k)).sum();
        p.ready.clear();
        p.held -= dropped;
        let running = p.running.clone();
        let mut seen = std::collections::HashSet::new();
        p.queue.extend(
            hints
                .into_iter()
                .filter(|k| !running.contains(k) && seen.insert(*k)),
        );
        self.changed.notify_all();
    }

    /// Takes expert `k` for a demand read of its layer: a ready read, else waits for a running
    /// one, else un-queues the hint. Hints and reads for earlier layers are dropped.
    pub(crate) fn take(&self, k: ExpertKey, len: impl Fn(ExpertKey) -> u64) -> Result<Found> {
        let mut p = self
            .state
            .lock()
            .map_err(|_| crate::Error::Msg("prefetch lock poisoned".into()))?;
        let layer = k.0;
        p.queue.retain(|q| q.0 >= layer && *q != k);
        let stale: Vec<ExpertKey> = p.ready.keys().filter(|q| q.0 < layer).copied().collect();
        for s in stale {
            p.ready.remove(&s);
            p.held -= len(s);
        }
        while p.running.contains(&k) {
            p = self
                .changed
                .wait(p)
                .map_err(|_| crate::Error::Msg("prefetch lock poisoned".into()))?;
        }
        self.changed.notify_all();
        Ok(match p.ready.remove(&k) {
            Some(r) => {
                p.held -= len(k);
                Found::Ready(r)
            }
            None => Found::Absent,
        })
    }

    /// Stops the threads.
    pub(crate) fn shutdown(&self) {
        if let Ok(mut p) = self.state.lock() {
            p.shutdown = true;
            p.queue.clear();
        }
        self.changed.notify_all();
    }

    /// Most bytes held at once so far.
    pub(crate) fn peak(&self) -> u64 {
        self.state.lock().map(|p| p.peak).unwrap_or(0)
    }
}

fn worker(inner: &Arc<Inner>) {
    let pf = &inner.prefetcher;
    let cap = inner.prefetch_cap;
    loop {
        let (k, size, generation) = {
            let Ok(mut p) = pf.state.lock() else { return };
            loop {
                if p.shutdown {
                    return;
                }
                if let Some(&k) = p.queue.front() {
                    if p.running.contains(&k) || p.ready.contains_key(&k) {
                        p.queue.pop_front(); // already being read or read
                        continue;
                    }
                    let size = inner.span_len(k);
                    if p.held + size <= cap {
                        p.queue.pop_front();
                        p.running.insert(k);
                        p.held += size;
                        p.peak = p.peak.max(p.held);
                        if let Ok(mut st) = inner.stats.lock() {
                            st.prefetch_issued += 1;
                        }
                        break (k, size, p.generation);
                    }
                }
                let Ok(q) = pf.changed.wait(p) else { return };
                p = q;
            }
        };
        // A panicking read must still leave `running` and `held` (demand reads wait on them).
        let res =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.read_for_prefetch(k)))
                .unwrap_or_else(|_| Err(crate::Error::Msg("prefetch read panicked".into())));
        let Ok(mut p) = pf.state.lock() else { return };
        p.running.remove(&k);
        match res {
            Ok(Some(r)) if p.generation == generation => {
                p.ready.insert(k, r);
            }
            other => {
                if let Err(e) = other {
                    // The demand fetch will retry and report the error.
                    tracing::debug!(layer = k.0, expert = k.1, error = %e, "prefetch failed");
                }
                p.held -= size;
            }
        }
        pf.changed.notify_all();
    }
}
