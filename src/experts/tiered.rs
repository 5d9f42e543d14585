//! `TieredExperts`: the streaming expert store. Each expert comes from the first tier that has
//! it: the RAM tier, the raw-span disk cache, then the local shards; a layer's missing experts
//! are read concurrently by a bounded reader pool.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use super::disk::{drop_from_page_cache, CacheAdvice, DiskCache};
use super::ram::{ExpertKey, RamTier};
use super::{ExpertBytes, ExpertProvider};
use crate::checkpoint::{ExpertIndex, Inventory, ShardFiles};
use crate::hub::HubRepo;
use crate::{Error, Result};

/// Experts fetched together: `(expert, bytes)`.
type Fetched = Vec<(usize, Vec<u8>)>;
/// One expert's bytes and where they came from.
type Read = (Vec<u8>, Tier);

/// Most experts joined into one range request.
const MAX_COALESCE: usize = 4;

/// Where an expert came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The RAM tier.
    Ram,
    /// The raw-span disk cache.
    Disk,
    /// The local shards.
    Shard,
    /// The hub (range fetch), published into the disk cache.
    Hub,
}

/// Counters per tier since the provider was built (or last reset).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ExpertStats {
    /// Experts served from RAM.
    pub ram_experts: u64,
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
    /// Seconds spent waiting for reads.
    pub read_wait_s: f64,
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
}

impl Default for TieredOptions {
    fn default() -> Self {
        TieredOptions {
            ram_budget: 1 << 30,
            decay: 0.95,
            readers: 8,
            advice: CacheAdvice::Auto,
        }
    }
}

/// The tiered expert store.
pub struct TieredExperts {
    index: Arc<ExpertIndex>,
    inv: Option<Arc<Inventory>>,
    disk: Option<DiskCache>,
    ram: Mutex<RamTier>,
    pool: rayon::ThreadPool,
    advice: CacheAdvice,
    stats: Mutex<ExpertStats>,
    files: Option<ShardFiles>,
    hub: Option<Arc<HubRepo>>,
    remote_inv: Option<Arc<Inventory>>,
    inflight: Mutex<HashMap<ExpertKey, Arc<Mutex<()>>>>,
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
        let files = inv.clone().map(ShardFiles::new);
        Ok(TieredExperts {
            index,
            inv,
            disk,
            ram: Mutex::new(RamTier::new(opts.ram_budget, opts.decay)),
            pool,
            advice: opts.advice,
            stats: Mutex::new(ExpertStats::default()),
            files,
            hub: None,
            remote_inv: None,
            inflight: Mutex::new(HashMap::new()),
        })
    }

    /// Adds the hub tier: missing experts are range-fetched from the shard files of the hub
    /// repository and published into the disk cache (which must be configured). `inv` describes
    /// the remote shards.
    pub fn with_hub(mut self, hub: Arc<HubRepo>, inv: Arc<Inventory>) -> Result<Self> {
        if self.disk.is_none() {
            return Err(Error::Msg(
                "the hub tier needs a disk cache to publish into".into(),
            ));
        }
        self.remote_inv = Some(inv);
        self.hub = Some(hub);
        Ok(self)
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads one expert from the disk cache or the shards; `None` when neither has it.
    fn read_local(&self, layer: usize, expert: usize) -> Result<Option<(Vec<u8>, Tier)>> {
        let span = self
            .index
            .span(layer, expert)
            .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {expert}")))?;
        let len = span.len() as usize;
        if let Some(d) = &self.disk {
            if let Some(b) = d.read(layer, expert, len)? {
                return Ok(Some((b, Tier::Disk)));
            }
        }
        let Some((inv, files)) = self.inv.as_ref().zip(self.files.as_ref()) else {
            return Ok(None);
        };
        let f = files.get(span.shard)?;
        let mut buf = vec![0u8; len];
        let mut o = 0usize;
        let parts: Vec<(u64, u64)> = if span.is_contiguous() {
            vec![(span.start(), span.len())]
        } else {
            span.parts.clone()
        };
        for (start, n) in parts {
            f.read_exact_at(&mut buf[o..o + n as usize], start)
                .map_err(|e| Error::io(inv.shard_path(span.shard), e))?;
            drop_from_page_cache(&f, start, n, self.advice);
            o += n as usize;
        }
        Ok(Some((buf, Tier::Shard)))
    }

    /// Reads one expert from any tier below RAM.
    fn read_one(&self, layer: usize, expert: usize) -> Result<(Vec<u8>, Tier)> {
        if let Some(r) = self.read_local(layer, expert)? {
            return Ok(r);
        }
        if self.hub.is_some() {
            let mut got = self.fetch_hub(layer, &[expert])?;
            if let Some((_, b)) = got.pop() {
                return Ok((b, Tier::Hub));
            }
        }
        Err(Error::Msg(format!(
            "expert {expert} of layer {layer} is in no tier (not in RAM, not in the disk cache, no local shards, no hub)"
        )))
    }

    /// Range-fetches experts of one layer from the hub, coalescing experts that are adjacent in
    /// the same shard into one request, and publishes each into the disk cache. Concurrent
    /// requests for the same expert fetch it once.
    fn fetch_hub(&self, layer: usize, experts: &[usize]) -> Result<Vec<(usize, Vec<u8>)>> {
        let (hub, inv, disk) = match (&self.hub, &self.remote_inv, &self.disk) {
            (Some(h), Some(i), Some(d)) => (h, i, d),
            _ => return Err(Error::Msg("no hub tier configured".into())),
        };
        // Runs of experts whose whole spans are contiguous and adjacent in one shard.
        let mut spans: Vec<(usize, usize, u64, u64)> = Vec::new(); // (expert, shard, start, len)
        for &e in experts {
            let s = self
                .index
                .span(layer, e)
                .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {e}")))?;
            if s.is_contiguous() {
                spans.push((e, s.shard, s.start(), s.len()));
            } else {
                spans.push((e, s.shard, u64::MAX, s.len()));
            }
        }
        spans.sort_by_key(|x| (x.1, x.2, x.0));
        let mut groups: Vec<Vec<(usize, usize, u64, u64)>> = Vec::new();
        for sp in spans {
            let join = groups
                .last()
                .is_some_and(|g: &Vec<(usize, usize, u64, u64)>| {
                    let l = g[g.len() - 1];
                    sp.2 != u64::MAX
                        && l.2 != u64::MAX
                        && l.1 == sp.1
                        && l.2 + l.3 == sp.2
                        && g.len() < MAX_COALESCE
                });
            if join {
                if let Some(g) = groups.last_mut() {
                    g.push(sp);
                }
            } else {
                groups.push(vec![sp]);
            }
        }
        let results: Vec<Result<Fetched>> = self.pool.install(|| {
            groups
                .par_iter()
                .map(|g| {
                    // Hold every expert's in-flight lock (in id order), then look again.
                    let mut ids: Vec<usize> = g.iter().map(|x| x.0).collect();
                    ids.sort_unstable();
                    let locks: Vec<Arc<Mutex<()>>> = {
                        let mut m = self
                            .inflight
                            .lock()
                            .map_err(|_| Error::Msg("in-flight table poisoned".into()))?;
                        ids.iter()
                            .map(|&e| m.entry((layer, e)).or_default().clone())
                            .collect()
                    };
                    let _guards: Vec<_> = locks.iter().map(|l| l.lock()).collect();
                    let mut cached = Vec::new();
                    for &(e, _, _, len) in g {
                        match disk.read(layer, e, len as usize)? {
                            Some(b) => cached.push((e, b)),
                            None => break,
                        }
                    }
                    if cached.len() == g.len() {
                        return Ok(cached);
                    }
                    let mut out = Vec::new();
                    let mut requests = 0u64;
                    let file = &inv.shards[g[0].1].file;
                    if g[0].2 == u64::MAX {
                        // Scattered parts: one request per part.
                        let e = g[0].0;
                        let span = self
                            .index
                            .span(layer, e)
                            .ok_or_else(|| Error::Msg("span vanished".into()))?;
                        let mut b = Vec::with_capacity(span.len() as usize);
                        for &(start, n) in &span.parts {
                            b.extend(self.hub_range(hub, file, start..start + n, layer, e)?);
                            requests += 1;
                        }
                        out.push((e, b));
                    } else {
                        let start = g[0].2;
                        let end = g[g.len() - 1].2 + g[g.len() - 1].3;
                        let all = self.hub_range(hub, file, start..end, layer, g[0].0)?;
                        requests += 1;
                        for &(e, _, s, n) in g {
                            let o = (s - start) as usize;
                            out.push((e, all[o..o + n as usize].to_vec()));
                        }
                    }
                    for (e, b) in &out {
                        disk.publish(layer, *e, b)?;
                    }
                    if let Ok(mut st) = self.stats.lock() {
                        st.hub_requests += requests;
                    }
                    Ok(out)
                })
                .collect()
        });
        let mut out = Vec::new();
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }

    fn hub_range(
        &self,
        hub: &HubRepo,
        file: &str,
        range: std::ops::Range<u64>,
        layer: usize,
        expert: usize,
    ) -> Result<Vec<u8>> {
        hub.fetch_range(file, range)
            .map_err(|e| Error::Msg(format!("layer {layer}, expert {expert}: {e}")))
    }

    /// Copies experts from the shards into the disk cache (the cache warmer's core).
    pub fn warm_disk_cache(&self, layer: usize, experts: &[usize]) -> Result<()> {
        let d = self
            .disk
            .as_ref()
            .ok_or_else(|| Error::Msg("no disk cache configured".into()))?;
        self.pool.install(|| {
            experts.par_iter().try_for_each(|&e| -> Result<()> {
                let (b, tier) = self.read_one(layer, e)?;
                if tier != Tier::Disk {
                    d.publish(layer, e, &b)?;
                }
                Ok(())
            })
        })
    }
}

impl ExpertProvider for TieredExperts {
    fn fetch(&self, layer: usize, experts: &[usize]) -> Result<Vec<ExpertBytes>> {
        let mut out: Vec<Option<ExpertBytes>> = vec![None; experts.len()];
        let mut missing = Vec::new();
        {
            let mut ram = self
                .ram
                .lock()
                .map_err(|_| Error::Msg("RAM tier poisoned".into()))?;
            for (i, &e) in experts.iter().enumerate() {
                ram.record((layer, e));
                match ram.get(&(layer, e)) {
                    Some(b) => out[i] = Some(b),
                    None => missing.push(i),
                }
            }
        }
        let t0 = Instant::now();
        let local: Vec<Result<Option<Read>>> = self.pool.install(|| {
            missing
                .par_iter()
                .map(|&i| self.read_local(layer, experts[i]))
                .collect()
        });
        let mut read: Vec<Result<(Vec<u8>, Tier)>> = Vec::with_capacity(missing.len());
        let mut remote = Vec::new();
        for (k, r) in local.into_iter().enumerate() {
            match r {
                Ok(Some(x)) => read.push(Ok(x)),
                Ok(None) => {
                    remote.push(k);
                    read.push(Err(Error::Msg(String::new())));
                }
                Err(e) => read.push(Err(e)),
            }
        }
        if !remote.is_empty() {
            let e = experts[missing[remote[0]]];
            if self.hub.is_none() {
                return Err(Error::Msg(format!(
                    "expert {e} of layer {layer} is in no tier (not in RAM, not in the disk cache, no local shards, no hub)"
                )));
            }
            let ids: Vec<usize> = remote.iter().map(|&k| experts[missing[k]]).collect();
            let got: HashMap<usize, Vec<u8>> = self.fetch_hub(layer, &ids)?.into_iter().collect();
            for &k in &remote {
                let e = experts[missing[k]];
                read[k] = got.get(&e).cloned().map(|b| (b, Tier::Hub)).ok_or_else(|| {
                    Error::Msg(format!(
                        "hub fetch of expert {e} of layer {layer} returned nothing"
                    ))
                });
            }
        }
        let wait = t0.elapsed().as_secs_f64();
        let mut st = self
            .stats
            .lock()
            .map_err(|_| Error::Msg("stats poisoned".into()))?;
        st.ram_experts += (experts.len() - missing.len()) as u64;
        st.read_wait_s += wait;
        let mut ram = self
            .ram
            .lock()
            .map_err(|_| Error::Msg("RAM tier poisoned".into()))?;
        for (&i, r) in missing.iter().zip(read) {
            let (bytes, tier) = r?;
            match tier {
                Tier::Disk => {
                    st.disk_experts += 1;
                    st.disk_bytes += bytes.len() as u64;
                }
                Tier::Hub => {
                    st.hub_experts += 1;
                    st.hub_bytes += bytes.len() as u64;
                }
                _ => {
                    st.shard_experts += 1;
                    st.shard_bytes += bytes.len() as u64;
                }
            }
            let b: ExpertBytes = bytes.into();
            ram.insert((layer, experts[i]), b.clone());
            out[i] = Some(b);
        }
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::Msg("expert fetch left a gap".into())))
            .collect()
    }

    fn begin_token(&self) {
        if let Ok(mut ram) = self.ram.lock() {
            ram.next_token();
        }
    }
}
