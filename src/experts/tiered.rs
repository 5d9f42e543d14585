//! `TieredExperts`: the streaming expert store. Each expert comes from the first tier that has
//! it: the RAM tier, a finished prefetch, the raw-span disk cache, the local shards, then the hub
//! (range fetch, published into the disk cache). A layer's missing experts are read concurrently
//! by a bounded reader pool; at the start of each token the experts the previous position chose
//! in every layer are prefetched in the background, within a byte cap (`prefetch.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::disk::{CacheAdvice, DiskCache};
use super::prefetch::Prefetcher;
use super::ram::{ExpertKey, RamTier};
pub use super::stats::ExpertStats;
use super::{read_span_into, ExpertBytes, ExpertProvider};
use crate::checkpoint::{ExpertIndex, Inventory, ShardFiles};
use crate::fsio::{BufPool, PooledBuf};
use crate::hub::HubRepo;
use crate::{Error, Result};

/// Where an expert came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// A storage home (`homes.rs`).
    Home,
    /// The raw-span disk cache.
    Disk,
    /// The local shards.
    Shard,
    /// The hub (range fetch), published into the disk cache.
    Hub,
}

/// One expert's bytes and where they came from.
pub(crate) type Read = (PooledBuf, Tier);

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
    /// Prefetch the previous position's experts at the start of each token.
    pub prefetch_previous: bool,
    /// Most bytes the prefetch may hold (reading + ready); the memory plan sets it.
    pub prefetch_cap: u64,
    /// Let prefetch fetch from the hub tier (off: prefetch reads only local tiers).
    pub prefetch_hub: bool,
    /// Threads that run prefetch reads (separate from the demand readers).
    pub prefetch_threads: usize,
    /// Idle expert buffers kept for reuse.
    pub pool_buffers: usize,
    /// Verify the install's own expert cache (a streaming install's `experts/`) on every read.
    pub verify_cache: bool,
    /// Storage homes (`--storage-home`, `install.json`), tried before the disk cache and shards.
    pub homes: Vec<std::path::PathBuf>,
    /// Emulation: limit every storage home to this many bytes per second (tests, `bench homes`).
    pub home_rate: Option<f64>,
}

impl Default for TieredOptions {
    fn default() -> Self {
        TieredOptions {
            ram_budget: 1 << 30,
            decay: 0.95,
            readers: 8,
            advice: CacheAdvice::Auto,
            prefetch_previous: true,
            prefetch_cap: 1 << 30,
            prefetch_hub: false,
            prefetch_threads: 2,
            pool_buffers: 16,
            verify_cache: false,
            homes: Vec::new(),
            home_rate: None,
        }
    }
}

pub(crate) struct Inner {
    pub(crate) index: Arc<ExpertIndex>,
    files: Option<ShardFiles>,
    pub(crate) disk: Option<DiskCache>,
    homes: Option<super::homes::Homes>,
    pub(crate) hub: Option<(Arc<HubRepo>, Arc<Inventory>)>,
    pub(super) ram: Mutex<RamTier>,
    pub(crate) pool: rayon::ThreadPool,
    bufs: Arc<BufPool>,
    advice: CacheAdvice,
    pub(crate) stats: Mutex<ExpertStats>,
    pub(crate) inflight: Mutex<HashMap<ExpertKey, Arc<Mutex<()>>>>,
    pub(crate) prefetcher: Prefetcher,
    pub(crate) prefetch_cap: u64,
    prefetch_hub: bool,
    last: Mutex<HashMap<usize, Vec<usize>>>,
}

/// The tiered expert store.
pub struct TieredExperts {
    inner: Arc<Inner>,
    prefetch_threads: usize,
    started: std::sync::Once,
}

impl Drop for TieredExperts {
    fn drop(&mut self) {
        self.inner.prefetcher.shutdown();
    }
}

impl Inner {
    /// Reads one expert from the disk cache or the shards; `None` when neither has it.
    pub(crate) fn read_local(&self, layer: usize, expert: usize) -> Result<Option<Read>> {
        let span = self
            .index
            .span(layer, expert)
            .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {expert}")))?;
        let len = span.len() as usize;
        let mut buf = self.bufs.take_sized(len, super::span_cap(len))?;
        if let Some(h) = &self.homes {
            if h.read_into(layer, expert, &mut buf)? {
                return Ok(Some((buf, Tier::Home)));
            }
        }
        if let Some(d) = &self.disk {
            if d.read_into_pooled(layer, expert, &mut buf)? {
                return Ok(Some((buf, Tier::Disk)));
            }
        }
        let Some(files) = self.files.as_ref() else {
            return Ok(None);
        };
        if self.advice == CacheAdvice::Auto {
            drop(buf); // back to the pool, for the direct read to take
            if let Some(b) = super::read_span_direct(files, span, &self.bufs)? {
                return Ok(Some((b, Tier::Shard)));
            }
            buf = self.bufs.take_sized(len, super::span_cap(len))?;
        }
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
                    out[k] = Some((PooledBuf::owned(b), Tier::Hub));
                }
            }
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::Msg("expert read left a gap".into())))
            .collect()
    }

    /// Bytes of expert `k`'s span (0 when it does not exist).
    pub(crate) fn span_len(&self, k: ExpertKey) -> u64 {
        self.index.span(k.0, k.1).map(|s| s.len()).unwrap_or(0)
    }

    /// One prefetch read: local tiers, and the hub only when allowed.
    pub(crate) fn read_for_prefetch(&self, k: ExpertKey) -> Result<Option<Read>> {
        if let Some(r) = self.read_local(k.0, k.1)? {
            return Ok(Some(r));
        }
        if !self.prefetch_hub || self.hub.is_none() {
            return Ok(None);
        }
        let got = self.fetch_hub(k.0, &[k.1])?;
        Ok(got
            .into_iter()
            .next()
            .map(|(_, b)| (PooledBuf::owned(b), Tier::Hub)))
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
        let homes = if opts.homes.is_empty() {
            None
        } else {
            Some(super::homes::Homes::open(
                &opts.homes,
                opts.advice,
                opts.verify_cache,
                opts.home_rate,
            )?)
        };
        Ok(TieredExperts {
            inner: Arc::new(Inner {
                index,
                files: inv.map(ShardFiles::new),
                disk,
                homes,
                hub: None,
                ram: Mutex::new(RamTier::new(opts.ram_budget, opts.decay)),
                pool,
                bufs: BufPool::new(opts.pool_buffers),
                advice: opts.advice,
                stats: Mutex::new(ExpertStats::default()),
                inflight: Mutex::new(HashMap::new()),
                prefetcher: Prefetcher::default(),
                prefetch_cap: opts.prefetch_cap,
                prefetch_hub: opts.prefetch_hub,
                last: Mutex::new(HashMap::new()),
            }),
            prefetch_threads: if opts.prefetch_previous {
                opts.prefetch_threads.max(1)
            } else {
                0
            },
            started: std::sync::Once::new(),
        })
    }

    /// The storage homes, when the store has any.
    pub fn homes(&self) -> Option<&super::homes::Homes> {
        self.inner.homes.as_ref()
    }

    /// Starts the prefetch threads (once the store is final, see `with_hub`).
    fn start_prefetch(&self) {
        self.started
            .call_once(|| Prefetcher::start(&self.inner, self.prefetch_threads));
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
        let mut s = self
            .inner
            .stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        s.prefetch_peak_bytes = self.inner.prefetcher.peak();
        s
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

    fn fetch_each(
        &self,
        layer: usize,
        experts: &[usize],
        ready: &mut super::Ready<'_>,
    ) -> Result<()> {
        self.inner.fetch_each(layer, experts, ready)
    }

    fn note_routes(&self, layer: usize, experts: &[usize]) {
        if let Ok(mut last) = self.inner.last.lock() {
            last.insert(layer, experts.to_vec());
        }
    }

    fn begin_token(&self) {
        let Ok(mut ram) = self.inner.ram.lock() else {
            return;
        };
        ram.next_token();
        if self.prefetch_threads == 0 {
            return;
        }
        self.start_prefetch();
        let mut hints: Vec<ExpertKey> = match self.inner.last.lock() {
            Ok(mut l) => l
                .drain()
                .flat_map(|(layer, ids)| ids.into_iter().map(move |e| (layer, e)))
                .filter(|k| !ram.contains(k))
                .collect(),
            Err(_) => return,
        };
        drop(ram);
        hints.sort_unstable();
        self.inner
            .prefetcher
            .restart(hints, |k| self.inner.span_len(k));
    }

    fn stats(&self) -> Option<ExpertStats> {
        Some(TieredExperts::stats(self))
    }
}
