//! The hub tier of `TieredExperts`: range fetches that coalesce adjacent experts, with one
//! fetch per expert however many callers want it, published into the disk cache.

use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use super::tiered::Inner;
use crate::checkpoint::Inventory;
use crate::hub::HubRepo;
use crate::{Error, Result};

/// Most experts joined into one range request.
const MAX_COALESCE: usize = 4;

/// `(expert, bytes)` pairs fetched together.
type Fetched = Vec<(usize, Vec<u8>)>;

/// `(expert, shard, absolute start or u64::MAX when scattered, length)`.
type Piece = (usize, usize, u64, u64);

impl Inner {
    /// Range-fetches experts of one layer from the hub and publishes each into the disk cache.
    pub(crate) fn fetch_hub(&self, layer: usize, experts: &[usize]) -> Result<Fetched> {
        let ((hub, inv), disk) = match (&self.hub, &self.disk) {
            (Some(h), Some(d)) => (h, d),
            _ => return Err(Error::Msg("no hub tier configured".into())),
        };
        let mut pieces: Vec<Piece> = Vec::new();
        for &e in experts {
            let s = self
                .index
                .span(layer, e)
                .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {e}")))?;
            let start = if s.is_contiguous() {
                s.start()
            } else {
                u64::MAX
            };
            pieces.push((e, s.shard, start, s.len()));
        }
        pieces.sort_by_key(|x| (x.1, x.2, x.0));
        let mut groups: Vec<Vec<Piece>> = Vec::new();
        for p in pieces {
            match groups.last_mut() {
                Some(g)
                    if g.len() < MAX_COALESCE
                        && p.2 != u64::MAX
                        && g[g.len() - 1].2 != u64::MAX
                        && g[g.len() - 1].1 == p.1
                        && g[g.len() - 1].2 + g[g.len() - 1].3 == p.2 =>
                {
                    g.push(p)
                }
                _ => groups.push(vec![p]),
            }
        }
        let one = |g: &Vec<Piece>| self.fetch_group(layer, g, hub, inv, disk);
        // One group (a prefetch's single expert) runs on the calling thread, so a prefetch never
        // occupies the demand readers' pool.
        let results: Vec<Result<Fetched>> = if groups.len() == 1 {
            groups.iter().map(one).collect()
        } else {
            self.pool.install(|| groups.par_iter().map(one).collect())
        };
        let mut out = Vec::new();
        for r in results {
            out.extend(r?);
        }
        Ok(out)
    }

    fn fetch_group(
        &self,
        layer: usize,
        g: &[Piece],
        hub: &HubRepo,
        inv: &Inventory,
        disk: &super::DiskCache,
    ) -> Result<Fetched> {
        // Hold every expert's in-flight lock (in id order), then look in the cache again: a
        // concurrent caller may have published it meanwhile.
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
        let fetch = |shard: usize, range: std::ops::Range<u64>, e: usize| {
            hub.fetch_range(&inv.shards[shard].file, range)
                .map_err(|err| Error::Msg(format!("layer {layer}, expert {e}: {err}")))
        };
        let mut out = Vec::new();
        let mut requests = 0u64;
        if g[0].2 == u64::MAX {
            // Scattered parts: one request per part, assembled in canonical order.
            let e = g[0].0;
            let span = self
                .index
                .span(layer, e)
                .ok_or_else(|| Error::Msg(format!("layer {layer} has no routed expert {e}")))?;
            let mut b = Vec::with_capacity(span.len() as usize);
            for (p, &(start, n)) in span.parts.iter().enumerate() {
                b.extend(fetch(span.part_shard(p), start..start + n, e)?);
                requests += 1;
            }
            out.push((e, b));
        } else {
            let start = g[0].2;
            let end = g[g.len() - 1].2 + g[g.len() - 1].3;
            let all = fetch(g[0].1, start..end, g[0].0)?;
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
    }
}
