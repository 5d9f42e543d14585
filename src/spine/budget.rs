//! How much of the spine can stay resident: memory (cgroup limits included) minus a reserve for
//! the OS and page cache (`max(10 GB, 18%)`) minus fixed costs.

/// Memory figures of this machine (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Physical memory (`MemTotal`).
    pub total: u64,
    /// Memory available now (`MemAvailable`).
    pub available: u64,
    /// The cgroup memory limit, when one is set.
    pub cgroup_limit: Option<u64>,
}

const GB: u64 = 1_000_000_000;

impl Memory {
    /// Reads `/proc/meminfo` and the cgroup (v2, then v1) limit; zeros when unknown.
    pub fn read() -> Memory {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |k: &str| {
            meminfo
                .lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .map(|kb| kb * 1024)
                .unwrap_or(0)
        };
        let read_u64 = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let cgroup_limit = read_u64("/sys/fs/cgroup/memory.max")
            .or_else(|| read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
            .filter(|&l| l < (1u64 << 60));
        let total = field("MemTotal:");
        #[cfg(target_os = "macos")]
        let total = if total == 0 { macos_memsize() } else { total };
        Memory {
            total,
            available: field("MemAvailable:"),
            cgroup_limit,
        }
    }

    /// The memory this process may use: physical memory capped by the cgroup limit.
    pub fn effective_total(&self) -> u64 {
        match self.cgroup_limit {
            Some(l) => l.min(self.total),
            None => self.total,
        }
    }
}

/// Physical memory on macOS (`sysctl hw.memsize`).
#[cfg(target_os = "macos")]
fn macos_memsize() -> u64 {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>();
    // SAFETY: a NUL-terminated name and an out-parameter of the size we pass.
    let rc = unsafe {
        libc::sysctlbyname(
            c"hw.memsize".as_ptr(),
            (&mut v as *mut u64).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc == 0 {
        v
    } else {
        0
    }
}

/// Bytes reserved for the OS and the page cache.
pub fn reserve(mem: &Memory) -> u64 {
    (10 * GB).max(mem.effective_total() * 18 / 100)
}

/// Bytes available for resident spine layers after the reserve and `fixed` costs.
pub fn resident_budget(mem: &Memory, fixed: u64) -> u64 {
    mem.effective_total()
        .saturating_sub(reserve(mem))
        .saturating_sub(fixed)
}

/// Which layers to pin: as many whole layers as fit in `budget`, in layer order.
pub fn choose_pinned(layer_bytes: &[u64], budget: u64) -> Vec<bool> {
    let mut used = 0u64;
    layer_bytes
        .iter()
        .map(|&b| {
            if used + b <= budget {
                used += b;
                true
            } else {
                false
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_arithmetic() {
        // 64 GB Mac: reserve max(10, 11.52) = 11.52 GB.
        let mac = Memory {
            total: 64 * GB,
            available: 50 * GB,
            cgroup_limit: None,
        };
        assert_eq!(reserve(&mac), 64 * GB * 18 / 100);
        assert_eq!(
            resident_budget(&mac, 4 * GB),
            64 * GB - 64 * GB * 18 / 100 - 4 * GB
        );
        // A cgroup limit smaller than physical memory wins.
        let box_ = Memory {
            total: 256 * GB,
            available: 200 * GB,
            cgroup_limit: Some(32 * GB),
        };
        assert_eq!(box_.effective_total(), 32 * GB);
        assert_eq!(resident_budget(&box_, 0), 22 * GB);
        // Tiny machine: nothing pinned.
        let tiny = Memory {
            total: 8 * GB,
            available: 6 * GB,
            cgroup_limit: None,
        };
        assert_eq!(resident_budget(&tiny, GB), 0);
        // Huge machine: 18% dominates.
        let huge = Memory {
            total: 1000 * GB,
            available: 900 * GB,
            cgroup_limit: None,
        };
        assert_eq!(resident_budget(&huge, 0), 820 * GB);
    }

    #[test]
    fn pins_whole_layers_in_order() {
        assert_eq!(
            choose_pinned(&[5, 5, 5, 5], 12),
            vec![true, true, false, false]
        );
        assert_eq!(choose_pinned(&[5, 5], 0), vec![false, false]);
        assert_eq!(choose_pinned(&[5, 5], u64::MAX), vec![true, true]);
    }
}
