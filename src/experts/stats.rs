//! `ExpertStats`: where experts came from and what waiting for them cost, as counters since a
//! provider was built (per-token figures are differences of two snapshots).

use super::tiered::Tier;

/// Counters since the provider was built.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ExpertStats {
    /// Experts served from RAM.
    pub ram_experts: u64,
    /// Experts served from a finished (or awaited) prefetch.
    pub prefetch_hits: u64,
    /// Experts prefetched in the background.
    pub prefetch_issued: u64,
    /// Experts read from a storage home.
    pub home_experts: u64,
    /// Bytes read from storage homes.
    pub home_bytes: u64,
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
    /// Most bytes the prefetch held at once (reading + ready), since the provider was built.
    pub prefetch_peak_bytes: u64,
}

impl ExpertStats {
    /// `self − earlier`, for per-token figures.
    pub fn since(&self, e: &ExpertStats) -> ExpertStats {
        ExpertStats {
            ram_experts: self.ram_experts - e.ram_experts,
            prefetch_hits: self.prefetch_hits - e.prefetch_hits,
            prefetch_issued: self.prefetch_issued - e.prefetch_issued,
            home_experts: self.home_experts - e.home_experts,
            home_bytes: self.home_bytes - e.home_bytes,
            disk_experts: self.disk_experts - e.disk_experts,
            disk_bytes: self.disk_bytes - e.disk_bytes,
            shard_experts: self.shard_experts - e.shard_experts,
            shard_bytes: self.shard_bytes - e.shard_bytes,
            hub_experts: self.hub_experts - e.hub_experts,
            hub_bytes: self.hub_bytes - e.hub_bytes,
            hub_requests: self.hub_requests - e.hub_requests,
            read_wait_s: self.read_wait_s - e.read_wait_s,
            prefetch_peak_bytes: self.prefetch_peak_bytes,
        }
    }

    /// Bytes read below RAM: homes, disk cache, shards and hub.
    pub fn bytes_read(&self) -> u64 {
        self.home_bytes + self.disk_bytes + self.shard_bytes + self.hub_bytes
    }

    pub(crate) fn count(&mut self, tier: Tier, bytes: usize) {
        let b = bytes as u64;
        match tier {
            Tier::Home => {
                self.home_experts += 1;
                self.home_bytes += b;
            }
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
