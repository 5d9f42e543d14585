//! `TieredExperts`: the streaming expert store. Each expert comes from the first tier that has
//! it: the RAM tier, the raw-span disk cache, then the local shards; a layer's missing experts
//! are read concurrently by a bounded reader pool.

use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rayon::prelude::*;

use super::disk::{drop_from_page_cache, CacheAdvice, DiskCache};
use super::ram::RamTier;
use super::{ExpertBytes, ExpertProvider};
use crate::checkpoint::{ExpertIndex, Inventory, ShardFiles};
use crate::{Error, Result};

/// Where an expert came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The RAM tier.
    Ram,
    /// The raw-span disk cache.
    Disk,
    /// The local shards.
    Shard,
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
        })
    }

    /// Counters so far.
    pub fn stats(&self) -> ExpertStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Reads one expert from the disk cache or the shards.
    fn read_one(&self, layer: usize, expert: usize) -> Result<(Vec<u8>, Tier)> {
        let span = self
            .index
            .span(layer, expert)
            .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {expert}")))?;
        let len = span.len() as usize;
        if let Some(d) = &self.disk {
            if let Some(b) = d.read(layer, expert, len)? {
                return Ok((b, Tier::Disk));
            }
        }
        let (inv, files) = self.inv.as_ref().zip(self.files.as_ref()).ok_or_else(|| {
            Error::Msg(format!("expert {expert} of layer {layer} is in no tier (no local shards, not in the disk cache)"))
        })?;
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
        Ok((buf, Tier::Shard))
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
        let read: Vec<Result<(Vec<u8>, Tier)>> = self.pool.install(|| {
            missing
                .par_iter()
                .map(|&i| self.read_one(layer, experts[i]))
                .collect()
        });
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
