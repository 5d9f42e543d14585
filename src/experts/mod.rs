//! `ExpertProvider`: the only way the MoE layer gets routed-expert bytes. Each expert is handed
//! over as its raw canonical span (the six tensors in `ExpertLayout` order, no padding).
//!
//! The tiered store over any checkpoint a family indexes (here the built-in K3-tiny): the
//! experts a layer's router picks are requested together and read in parallel, from the RAM
//! tier when there, else the disk cache, the shards or the hub.
//!
//! ```
//! use std::sync::Arc;
//! use deltafin::checkpoint::Inventory;
//! use deltafin::experts::{ExpertProvider, TieredExperts, TieredOptions};
//! # fn main() -> deltafin::Result<()> {
//! let root = deltafin::assets::k3_tiny()?;
//! let inv = Arc::new(Inventory::from_dir(&root)?);
//! let index = deltafin::models::family(&root)?.expert_index(&root, &inv)?;
//! let layer = index.spans.iter().position(|s| !s.is_empty()).expect("a MoE layer");
//! let span = index.layout.span_bytes() as usize;
//! let store = TieredExperts::new(Arc::new(index), Some(inv), None, &TieredOptions::default())?;
//! let bytes = store.fetch(layer, &[0, 3])?; // two experts' spans, in request order
//! assert!(bytes.iter().all(|b| b.len() == span));
//! let again = store.fetch(layer, &[3])?; // now from the RAM tier
//! assert_eq!(again[0][..], bytes[1][..]);
//! let stats = store.stats();
//! assert_eq!((stats.shard_experts, stats.ram_experts), (2, 1));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, RwLock};

use crate::checkpoint::{ExpertIndex, ExpertSpan, Inventory, ShardFiles};
use crate::{Error, Result};

mod arrival;
pub mod cache_source;
#[cfg(test)]
mod direct_tests;
pub mod disk;
pub mod homes;
mod prefetch;
pub mod ram;
mod remote;
mod stats;
pub mod tiered;

use crate::fsio::{BufPool, PooledBuf};
pub use disk::{drop_from_page_cache_all, CacheAdvice, DiskCache};
pub use homes::Homes;
pub use ram::RamTier;
pub use tiered::{ExpertStats, Tier, TieredExperts, TieredOptions};

/// The bytes of one expert, shared without copying.
pub type ExpertBytes = Arc<PooledBuf>;

/// Receives `(index into the request, bytes)` batches of experts as they arrive.
pub type Ready<'a> = dyn FnMut(&[(usize, ExpertBytes)]) -> Result<()> + 'a;

/// Supplies routed-expert bytes to a MoE layer.
pub trait ExpertProvider: Send + Sync {
    /// The bytes of each of `experts` of `layer`, in request order. A whole layer's selection is
    /// requested at once so implementations can read in parallel.
    fn fetch(&self, layer: usize, experts: &[usize]) -> Result<Vec<ExpertBytes>>;

    /// `fetch`, but each expert goes to `ready` as soon as its bytes are in (as `(index into
    /// experts, bytes)` batches, in any order), so the caller computes while later reads are in
    /// flight. Default: `fetch`, then one batch in request order.
    fn fetch_each(&self, layer: usize, experts: &[usize], ready: &mut Ready<'_>) -> Result<()> {
        let all: Vec<(usize, ExpertBytes)> = self
            .fetch(layer, experts)?
            .into_iter()
            .enumerate()
            .collect();
        ready(&all)
    }

    /// The experts the last position of the current pass chose in `layer`: the hint for what
    /// the next token will need (never a whole prefill chunk's union).
    fn note_routes(&self, _layer: usize, _experts: &[usize]) {}

    /// Called once before each forward pass: a decode token, a verify pass, or a prefill pass
    /// (all its positions, layer by layer), whose hints (`note_routes`) are the last
    /// position's.
    fn begin_token(&self) {}

    /// Counters of where experts came from, when the provider keeps them.
    fn stats(&self) -> Option<ExpertStats> {
        None
    }
}

/// The simplest provider: reads spans from the local shards via the inventory and keeps every
/// expert it has read in an in-RAM map.
pub struct ShardExperts {
    index: Arc<ExpertIndex>,
    files: ShardFiles,
    cache: RwLock<HashMap<(usize, usize), ExpertBytes>>,
}

impl ShardExperts {
    /// A provider over local shards.
    pub fn new(inv: Arc<Inventory>, index: Arc<ExpertIndex>) -> Self {
        ShardExperts {
            files: ShardFiles::new(inv),
            index,
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// Reads one expert's canonical span.
    pub fn read_span(&self, layer: usize, expert: usize) -> Result<Vec<u8>> {
        let span = self
            .index
            .span(layer, expert)
            .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {expert}")))?;
        let mut buf = vec![0u8; span.len() as usize];
        read_span_into(&self.files, span, &mut buf, CacheAdvice::Off)?;
        Ok(buf)
    }
}

/// Reads an expert's canonical span from its shard(s) into `buf` (`span.len()` bytes): one
/// positioned read when the parts are contiguous, one per part otherwise.
pub fn read_span_into(
    files: &ShardFiles,
    span: &ExpertSpan,
    buf: &mut [u8],
    advice: CacheAdvice,
) -> Result<()> {
    let contiguous = [(span.start(), span.len())];
    let parts: &[(u64, u64)] = if span.is_contiguous() {
        &contiguous
    } else {
        &span.parts
    };
    let mut o = 0usize;
    let mut open: Option<(usize, Arc<std::fs::File>)> = None;
    for (p, &(start, n)) in parts.iter().enumerate() {
        // A contiguous span is one part of `span.shard`; a split one names each part's shard.
        // The file is looked up (and advised) once per shard, not once per part.
        let shard = span.part_shard(p);
        if open.as_ref().is_none_or(|(s, _)| *s != shard) {
            let f = files.get(shard)?;
            disk::no_cache_on_open(&f, advice);
            open = Some((shard, f));
        }
        let Some((_, f)) = &open else { continue };
        f.read_exact_at(&mut buf[o..o + n as usize], start)
            .map_err(|e| Error::io(files.inventory().shard_path(shard), e))?;
        disk::drop_from_page_cache(f, start, n, advice);
        o += n as usize;
    }
    Ok(())
}

/// Reads an expert's contiguous span with 1 MiB `O_DIRECT` requests into a buffer from `pool`
/// (the aligned range around it, shown through a window): no page-cache copy, which on 2 cores
/// left the kernel a core's worth of work per token at K3's full shape. `Ok(None)`: the span is
/// not contiguous or the filesystem refuses direct reads (read it with `read_span_into`).
pub fn read_span_direct(
    files: &ShardFiles,
    span: &ExpertSpan,
    pool: &Arc<BufPool>,
) -> Result<Option<PooledBuf>> {
    use crate::fsio::direct::{read_serial, Request, IO_ALIGN, REQUEST};
    if !span.is_contiguous() {
        return Ok(None);
    }
    let Some(direct) = files.get_direct(span.shard)? else {
        return Ok(None);
    };
    let buffered = files.get(span.shard)?;
    let path = files.inventory().shard_path(span.shard);
    let al = IO_ALIGN as u64;
    let (s, e) = (span.start(), span.start() + span.len());
    let (a, b) = (s / al * al, e.div_ceil(al) * al);
    let mut buf = pool.take_sized((b - a) as usize, span_cap(span.len() as usize))?;
    if !(buf.as_ptr() as usize).is_multiple_of(IO_ALIGN) {
        return Ok(None);
    }
    let reqs = buf
        .chunks_mut(REQUEST)
        .enumerate()
        .map(|(k, dst)| {
            let off = a + (k * REQUEST) as u64;
            Request {
                direct: &direct,
                buffered: &buffered,
                path: &path,
                off,
                want: (dst.len() as u64).min(e - off) as usize,
                dst,
            }
        })
        .collect();
    read_serial(reqs)?;
    Ok(buf
        .set_window((s - a) as usize, span.len() as usize)
        .then_some(buf))
}

/// The capacity every expert buffer of a pool gets for a span of `len` bytes: room for the
/// aligned range a direct read covers, so one pool serves both kinds of read.
pub fn span_cap(len: usize) -> usize {
    len + 2 * crate::fsio::direct::IO_ALIGN
}

impl ExpertProvider for ShardExperts {
    fn fetch(&self, layer: usize, experts: &[usize]) -> Result<Vec<ExpertBytes>> {
        let mut out = Vec::with_capacity(experts.len());
        for &e in experts {
            if let Some(b) = self
                .cache
                .read()
                .map_err(|_| Error::Msg("expert cache poisoned".into()))?
                .get(&(layer, e))
            {
                out.push(b.clone());
                continue;
            }
            let b: ExpertBytes = Arc::new(PooledBuf::owned(self.read_span(layer, e)?));
            self.cache
                .write()
                .map_err(|_| Error::Msg("expert cache poisoned".into()))?
                .insert((layer, e), b.clone());
            out.push(b);
        }
        Ok(out)
    }
}
