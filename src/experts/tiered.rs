//! `TieredExperts`: the streaming expert store. Each expert comes from the first tier that has
//! it: the RAM tier, a finished prefetch, the raw-span disk cache, the local shards, then the hub
//! (range fetch, published into the disk cache). A layer's missing experts are read concurrently
//! by a bounded reader pool; at the start of each token the previous token's experts of every
//! layer are prefetched in the background.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use super::buf::{BufPool, ExpertBuf};
use super::disk::{CacheAdvice, DiskCache};
use super::ram::{ExpertKey, RamTier};
use super::{read_span_into, ExpertBytes, ExpertProvider};
use crate::checkpoint::{ExpertIndex, Inventory, ShardFiles};
use crate::hub::HubRepo;
use crate::{Error, Result};

/// Where an expert came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The raw-span disk cache.
    Disk,
    /// The local shards.
    Shard,
    /// The hub (range fetch), published into the disk cache.
    Hub,
}

/// One expert's bytes and where they came from.
pub(crate) type Read = (ExpertBuf, Tier);

/// Counters since the provider was built.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Experts served from RAM.
    pub ram_experts: u64,
    /// Experts served from a finished (or awaited) prefetch.
    pub prefetch_hits: u64,
    /// Experts prefetched in the background.
    pub prefetch_issued: u64,
    /// Experts read from the disk cache.
    pub disk_experts: u64,
    /// Bytes read from the disk cache.
    pub disk_bytes: u64,
    /// Experts read from the shards.
    pub shard_experts: u64,
    /// Bytes read from the shards.
    pub shard_bytes: u64,
    /// Experts fetched from the hub.
    pub hub_experts: u64,
    /// Bytes fetched from the hub.
    pub hub_bytes: u64,
    /// HTTP range requests made.
    pub hub_requests: u64,
    /// Seconds the model waited for expert bytes.
    pub read_wait_s: f64,
}

impl ExpertStats {
    /// `self − earlier`, for per-token figures.
    pub fn since(&self, e: &ExpertStats) -> ExpertStats {
        ExpertStats {
            ram_experts: self.ram_experts - e.ram_experts,
            prefetch_hits: self.prefetch_hits - e.prefetch_hits,
            prefetch_issued: self.prefetch_issued - e.prefetch_issued,
            disk_experts: self.disk_experts - e.disk_experts,
            disk_bytes: self.disk_bytes - e.disk_bytes,
            shard_experts: self.shard_experts - e.shard_experts,
            shard_bytes: self.shard_bytes - e.shard_bytes,
            hub_experts: self.hub_experts - e.hub_experts,
            hub_bytes: self.hub_bytes - e.hub_bytes,
            hub_requests: self.hub_requests - e.hub_requests,
            read_wait_s: self.read_wait_s - e.read_wait_s,
        }
    }

    fn count(&mut self, tier: Tier, bytes: usize) {
        let b = bytes as u64;
        match tier {
            Tier::Disk => {
                self.disk_experts += 1;
                self.disk_bytes += b;
            }
            Tier::Shard => {
                self.shard_experts += 1;
                self.shard_bytes += b;
            }
            Tier::Hub => {
                self.hub_experts += 1;
                self.hub_bytes += b;
            }
        }
    }
}

/// Settings of the tiered store.
#[derive(Debug, Clone)]
pub struct TieredOptions {
    /// RAM tier budget in bytes (0 disables the tier).
    pub ram_budget: usize,
    /// Per-token decay of the selection scores.
    pub decay: f64,
    /// Concurrent readers per layer.
    pub readers: usize,
    /// Page-cache policy for expert reads.
    pub advice: CacheAdvice,
    /// Prefetch the previous token's experts at the start of each token.
    pub prefetch_previous: bool,
    /// Idle expert buffers kept for reuse.
    pub pool_buffers: usize,
}

impl Default for TieredOptions {
    fn default() -> Self {
        TieredOptions {
            ram_budget: 1 << 30,
            decay: 0.95,
            readers: 8,
            advice: CacheAdvice::Auto,
            prefetch_previous: true,
            pool_buffers: 32,
        }
    }
}

#[derive(Default)]
struct Prefetches {
    pending: HashSet<ExpertKey>,
    ready: HashMap<ExpertKey, Read>,
}

pub(crate) struct Inner {
    pub(crate) index: Arc<ExpertIndex>,
    files: Option<ShardFiles>,
    pub(crate) disk: Option<DiskCache>,
    pub(crate) hub: Option<(Arc<HubRepo>, Arc<Inventory>)>,
    ram: Mutex<RamTier>,
    pub(crate) pool: rayon::ThreadPool,
    bufs: Arc<BufPool>,
    advice: CacheAdvice,
    pub(crate) stats: Mutex<ExpertStats>,
    pub(crate) inflight: Mutex<HashMap<ExpertKey, Arc<Mutex<()>>>>,
    prefetch: Mutex<Prefetches>,
    prefetch_done: Condvar,
    prefetch_previous: bool,
    last: Mutex<HashMap<usize, Vec<usize>>>,
}

/// The tiered expert store.
pub struct TieredExperts {
    inner: Arc<Inner>,
}

fn poisoned(what: &str) -> Error {
    Error::Msg(format!("{what} lock poisoned"))
}

impl Inner {
    /// Reads one expert from the disk cache or the shards; `None` when neither has it.
    pub(crate) fn read_local(&self, layer: usize, expert: usize) -> Result<Option<Read>> {
        let span = self
            .index
            .span(layer, expert)
            .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {expert}")))?;
        let len = span.len() as usize;
        let mut buf = self.bufs.take(len)?;
        if let Some(d) = &self.disk {
            if d.read_into(layer, expert, &mut buf)? {
                return Ok(Some((buf, Tier::Disk)));
            }
        }
        let Some(files) = self.files.as_ref() else {
            return Ok(None);
        };
        read_span_into(files, span, &mut buf, self.advice)?;
        Ok(Some((buf, Tier::Shard)))
    }

    /// Reads experts of one layer from the tiers below RAM, in request order.
    fn read_below_ram(&self, layer: usize, experts: &[usize]) -> Result<Vec<Read>> {
        let local: Vec<Result<Option<Read>>> = self.pool.install(|| {
            experts
                .par_iter()
                .map(|&e| self.read_local(layer, e))
                .collect()
        });
        let mut out: Vec<Option<Read>> = Vec::with_capacity(experts.len());
        let mut remote = Vec::new();
        for (k, r) in local.into_iter().enumerate() {
            let r = r?;
            if r.is_none() {
                remote.push(experts[k]);
            }
            out.push(r);
        }
        if !remote.is_empty() {
            if self.hub.is_none() {
                return Err(Error::Msg(format!(
                    "expert {} of layer {layer} is in no tier (not in RAM, not in the disk cache, no local shards, no hub)",
                    remote[0]
                )));
            }
            let got: HashMap<usize, Vec<u8>> =
                self.fetch_hub(layer, &remote)?.into_iter().collect();
            for (k, &e) in experts.iter().enumerate() {
                if out[k].is_none() {
                    let b = got.get(&e).cloned().ok_or_else(|| {
                        Error::Msg(format!(
                            "hub fetch of expert {e} of layer {layer} returned nothing"
                        ))
                    })?;
                    out[k] = Some((ExpertBuf::owned(b), Tier::Hub));
                }
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::Msg("expert read left a gap".into())))
            .collect()
    }

    /// Waits for a pending prefetch of `k` and takes its result.
    fn take_prefetched(&self, k: ExpertKey) -> Result<Option<Read>> {
        let mut p = self.prefetch.lock().map_err(|_| poisoned("prefetch"))?;
        while p.pending.contains(&k) {
            p = self
                .prefetch_done
                .wait(p)
                .map_err(|_| poisoned("prefetch"))?;
        }
        Ok(p.ready.remove(&k))
    }

    fn prefetch(self: &Arc<Self>, layer: usize, experts: &[usize]) {
        let mut todo = Vec::new();
        {
            let (Ok(ram), Ok(mut p)) = (self.ram.lock(), self.prefetch.lock()) else {
                return;
            };
            for &e in experts {
                let k = (layer, e);
                if !ram.contains(&k) && !p.pending.contains(&k) && !p.ready.contains_key(&k) {
                    p.pending.insert(k);
                    todo.push(e);
                }
            }
        }
        if todo.is_empty() {
            return;
        }
        if let Ok(mut st) = self.stats.lock() {
            st.prefetch_issued += todo.len() as u64;
        }
        let me = self.clone();
        self.pool.spawn(move || {
            let res = me.read_below_ram(layer, &todo);
            if let Ok(mut p) = me.prefetch.lock() {
                match res {
                    Ok(reads) => {
                        for (e, r) in todo.iter().zip(reads) {
                            p.pending.remove(&(layer, *e));
                            p.ready.insert((layer, *e), r);
                        }
                    }
                    Err(err) => {
                        // The foreground fetch will retry and report the error.
                        tracing::debug!(layer, error = %err, "prefetch failed");
                        for e in &todo {
                            p.pending.remove(&(layer, *e));
                        }
                    }
                }
                // Unused prefetches of old tokens must not pile up.
                if p.ready.len() > 4096 {
                    p.ready.clear();
                }
            }
            me.prefetch_done.notify_all();
        });
    }

    fn fetch(self: &Arc<Self>, layer: usize, experts: &[usize]) -> Result<Vec<ExpertBytes>> {
        let t0 = Instant::now();
        let mut out: Vec<Option<ExpertBytes>> = vec![None; experts.len()];
        let mut missing = Vec::new();
        {
            let mut ram = self.ram.lock().map_err(|_| poisoned("RAM tier"))?;
            for (i, &e) in experts.iter().enumerate() {
                ram.record((layer, e));
                match ram.get(&(layer, e)) {
                    Some(b) => out[i] = Some(b),
                    None => missing.push(i),
                }
            }
        }
        let mut reads: Vec<(usize, Read, bool)> = Vec::new();
        let mut cold = Vec::new();
        for &i in &missing {
            match self.take_prefetched((layer, experts[i]))? {
                Some(r) => reads.push((i, r, true)),
                None => cold.push(i),
            }
        }
        let ids: Vec<usize> = cold.iter().map(|&i| experts[i]).collect();
        for (&i, r) in cold.iter().zip(self.read_below_ram(layer, &ids)?) {
            reads.push((i, r, false));
        }
        let mut st = self.stats.lock().map_err(|_| poisoned("stats"))?;
        st.ram_experts += (experts.len() - missing.len()) as u64;
        let mut ram = self.ram.lock().map_err(|_| poisoned("RAM tier"))?;
        for (i, (bytes, tier), prefetched) in reads {
            if prefetched {
                st.prefetch_hits += 1;
            }
            st.count(tier, bytes.len());
            let b: ExpertBytes = Arc::new(bytes);
            ram.insert((layer, experts[i]), b.clone());
            out[i] = Some(b);
        }
        if let Ok(mut last) = self.last.lock() {
            last.insert(layer, experts.to_vec());
        }
        st.read_wait_s += t0.elapsed().as_secs_f64();
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::Msg("expert fetch left a gap".into())))
            .collect()
    }
}

impl TieredExperts {
    /// A store over an expert index, with optional shards (tier c) and disk cache (tier b).
    pub fn new(
        index: Arc<ExpertIndex>,
        inv: Option<Arc<Inventory>>,
        disk: Option<DiskCache>,
        opts: &TieredOptions,
    ) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.readers.max(1))
            .thread_name(|i| format!("expert-reader-{i}"))
            .build()
            .map_err(|e| Error::Msg(format!("expert reader pool: {e}")))?;
        Ok(TieredExperts {
            inner: Arc::new(Inner {
                index,
                files: inv.map(ShardFiles::new),
                disk,
                hub: None,
                ram: Mutex::new(RamTier::new(opts.ram_budget, opts.decay)),
                pool,
                bufs: BufPool::new(opts.pool_buffers),
                advice: opts.advice,
                stats: Mutex::new(ExpertStats::default()),
                inflight: Mutex::new(HashMap::new()),
                prefetch: Mutex::new(Prefetches::default()),
                prefetch_done: Condvar::new(),
                prefetch_previous: opts.prefetch_previous,
                last: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Adds the hub tier: missing experts are range-fetched from the shard files of the hub
    /// repository (described by `inv`) and published into the disk cache, which must be set.
    pub fn with_hub(mut self, hub: Arc<HubRepo>, inv: Arc<Inventory>) -> Result<Self> {
        let inner = Arc::get_mut(&mut self.inner).ok_or_else(|| {
            Error::Msg("with_hub must be called before the store is shared".into())
        })?;
        if inner.disk.is_none() {
            return Err(Error::Msg(
                "the hub tier needs a disk cache to publish into".into(),
            ));
        }
        inner.hub = Some((hub, inv));
        Ok(self)
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        self.inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }

    /// Copies experts of `layer` into the disk cache from the shards or the hub.
    pub fn warm_disk_cache(&self, layer: usize, experts: &[usize]) -> Result<()> {
        let d = self
            .inner
            .disk
            .as_ref()
            .ok_or_else(|| Error::Msg("no disk cache configured".into()))?;
        for (e, (b, tier)) in experts
            .iter()
            .zip(self.inner.read_below_ram(layer, experts)?)
        {
            if tier == Tier::Shard {
                d.publish(layer, *e, &b)?;
            }
        }
        Ok(())
    }
}

impl ExpertProvider for TieredExperts {
    fn fetch(&self, layer: usize, experts: &[usize]) -> Result<Vec<ExpertBytes>> {
        self.inner.fetch(layer, experts)
    }

    fn prefetch(&self, layer: usize, experts: &[usize]) {
        self.inner.prefetch(layer, experts);
    }

    fn begin_token(&self) {
        if let Ok(mut ram) = self.inner.ram.lock() {
            ram.next_token();
        }
        if self.inner.prefetch_previous {
            let last: Vec<(usize, Vec<usize>)> = match self.inner.last.lock() {
                Ok(l) => l.iter().map(|(k, v)| (*k, v.clone())).collect(),
                Err(_) => return,
            };
            for (layer, ids) in last {
                self.inner.prefetch(layer, &ids);
            }
        }
    }

    fn stats(&self) -> Option<ExpertStats> {
        Some(TieredExperts::stats(self))
    }
}
