//! Expert bytes handed to the MoE layer as they arrive: RAM-resident experts first, then
//! finished prefetches, then each cold read the moment it completes (the reader pool reads the
//! rest meanwhile), then the hub's. The MoE layer computes each batch while later reads are
//! still in flight, instead of waiting for the whole selection. Only the order of arrival
//! changes; every expert's bytes are the same, and the layer combines outputs in each row's
//! top-k order, so the result is bit-identical.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::prefetch::Found;
use super::tiered::{Inner, Read, Tier};
use super::{ExpertBytes, Ready};
use crate::fsio::PooledBuf;
use crate::{Error, Result};

fn poisoned(what: &str) -> Error {
    Error::Msg(format!("{what} lock poisoned"))
}

/// The caller's `ready`, and the time spent in it (not read wait).
struct Hand<'r, 'a> {
    ready: &'r mut Ready<'a>,
    in_ready: Duration,
}

impl Hand<'_, '_> {
    /// Hands a non-empty batch to `ready`, timing it.
    fn give(&mut self, batch: &[(usize, ExpertBytes)]) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let t = Instant::now();
        let r = (self.ready)(batch);
        self.in_ready += t.elapsed();
        r
    }
}

impl Inner {
    /// Puts reads into the RAM tier and the counters; returns them as shared bytes.
    fn admit(
        &self,
        layer: usize,
        experts: &[usize],
        reads: Vec<(usize, Read, bool)>,
    ) -> Result<Vec<(usize, ExpertBytes)>> {
        let mut st = self.stats.lock().map_err(|_| poisoned("stats"))?;
        let mut ram = self.ram.lock().map_err(|_| poisoned("RAM tier"))?;
        let mut out = Vec::with_capacity(reads.len());
        for (i, (bytes, tier), prefetched) in reads {
            if prefetched {
                st.prefetch_hits += 1;
            }
            st.count(tier, bytes.len());
            let b: ExpertBytes = Arc::new(bytes);
            ram.insert((layer, experts[i]), b.clone());
            out.push((i, b));
        }
        Ok(out)
    }

    /// Every expert of `experts` (of `layer`) to `ready`, in batches as they arrive. The time
    /// spent outside `ready` is counted as read wait.
    pub(crate) fn fetch_each(
        self: &Arc<Self>,
        layer: usize,
        experts: &[usize],
        ready: &mut Ready<'_>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let mut hand = Hand {
            ready,
            in_ready: Duration::ZERO,
        };
        let missing = self.give_ram_hits(layer, experts, &mut hand)?;
        let (mut prefetched, mut cold) = (Vec::new(), Vec::new());
        for &i in &missing {
            match self
                .prefetcher
                .take((layer, experts[i]), |k| self.span_len(k))?
            {
                Found::Ready(r) => prefetched.push((i, r, true)),
                Found::Absent => cold.push(i),
            }
        }
        hand.give(&self.admit(layer, experts, prefetched)?)?;
        let remote = self.read_cold(layer, experts, &cold, &mut hand)?;
        if !remote.is_empty() {
            self.read_remote(layer, experts, &remote, &mut hand)?;
        }
        let wait = t0.elapsed().saturating_sub(hand.in_ready).as_secs_f64();
        self.stats
            .lock()
            .map_err(|_| poisoned("stats"))?
            .read_wait_s += wait;
        Ok(())
    }

    /// Hands the RAM tier's experts over; returns the indices (into `experts`) it lacks.
    fn give_ram_hits(
        &self,
        layer: usize,
        experts: &[usize],
        hand: &mut Hand<'_, '_>,
    ) -> Result<Vec<usize>> {
        let mut hits = Vec::new();
        let mut missing = Vec::new();
        {
            let mut ram = self.ram.lock().map_err(|_| poisoned("RAM tier"))?;
            for (i, &e) in experts.iter().enumerate() {
                ram.record((layer, e));
                match ram.get(&(layer, e)) {
                    Some(b) => hits.push((i, b)),
                    None => missing.push(i),
                }
            }
        }
        self.stats
            .lock()
            .map_err(|_| poisoned("stats"))?
            .ram_experts += hits.len() as u64;
        hand.give(&hits)?;
        Ok(missing)
    }

    /// Reads the `cold` experts from local storage on the reader pool, handing each batch over
    /// as it completes; returns those no local tier holds.
    fn read_cold(
        self: &Arc<Self>,
        layer: usize,
        experts: &[usize],
        cold: &[usize],
        hand: &mut Hand<'_, '_>,
    ) -> Result<Vec<usize>> {
        let mut remote = Vec::new();
        if cold.is_empty() {
            return Ok(remote);
        }
        let mut first_err: Option<Error> = None;
        let (tx, rx) = mpsc::channel::<(usize, Result<Option<Read>>)>();
        self.pool.in_place_scope(|s| {
            for &i in cold {
                let (tx, me, e) = (tx.clone(), self.clone(), experts[i]);
                s.spawn(move |_| {
                    let _ = tx.send((i, me.read_local(layer, e)));
                });
            }
            drop(tx);
            while let Ok(m) = rx.recv() {
                let mut got = Vec::new();
                for (i, r) in std::iter::once(m).chain(rx.try_iter()) {
                    match r {
                        Ok(Some(read)) => got.push((i, read, false)),
                        Ok(None) => remote.push(i),
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
                if first_err.is_none() {
                    let r = self.admit(layer, experts, got).and_then(|b| hand.give(&b));
                    if let Err(e) = r {
                        first_err = Some(e);
                    }
                }
            }
        });
        match first_err {
            Some(e) => Err(e),
            None => Ok(remote),
        }
    }

    /// Fetches the `remote` experts from the hub and hands them over.
    fn read_remote(
        &self,
        layer: usize,
        experts: &[usize],
        remote: &[usize],
        hand: &mut Hand<'_, '_>,
    ) -> Result<()> {
        if self.hub.is_none() {
            return Err(Error::Msg(format!(
                "expert {} of layer {layer} is in no tier (not in RAM, not in the disk cache, no local shards, no hub)",
                experts[remote[0]]
            )));
        }
        let ids: Vec<usize> = remote.iter().map(|&i| experts[i]).collect();
        let mut got: std::collections::HashMap<usize, Vec<u8>> =
            self.fetch_hub(layer, &ids)?.into_iter().collect();
        let mut reads = Vec::new();
        for &i in remote {
            let b = got.remove(&experts[i]).ok_or_else(|| {
                Error::Msg(format!(
                    "hub fetch of expert {} of layer {layer} returned nothing",
                    experts[i]
                ))
            })?;
            reads.push((i, (PooledBuf::owned(b), Tier::Hub), false));
        }
        hand.give(&self.admit(layer, experts, reads)?)
    }

    /// Every expert at once, in request order (`fetch_each` collected).
    pub(crate) fn fetch(
        self: &Arc<Self>,
        layer: usize,
        experts: &[usize],
    ) -> Result<Vec<ExpertBytes>> {
        let mut out: Vec<Option<ExpertBytes>> = vec![None; experts.len()];
        self.fetch_each(layer, experts, &mut |batch| {
            for (i, b) in batch {
                out[*i] = Some(b.clone());
            }
            Ok(())
        })?;
        out.into_iter()
            .map(|o| o.ok_or_else(|| Error::Msg("expert fetch left a gap".into())))
            .collect()
    }
}
