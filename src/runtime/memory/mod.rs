//! Memory of this machine and of this process, and `MemoryPlan`: the one budget every consumer
//! is charged against before anything is pinned (`plan.rs`). Owns reading `/proc/meminfo`, the
//! cgroup limit and `/proc/self/status`; must not allocate model memory itself.

mod plan;
mod plan_choices;
pub use plan::{MemoryPlan, PlanInputs, PlanLine};

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

/// 10^9 bytes.
pub const GB: u64 = 1_000_000_000;

/// The tightest memory limit on this process's cgroup and its ancestors (`proc_cgroup` is
/// `/proc/self/cgroup`): v2 (`0::/path`, `memory.max`) and v1 (`N:memory:/path`,
/// `memory.limit_in_bytes`), each level read through `read`; "unlimited" values ignored.
fn cgroup_limit(proc_cgroup: &str, read: &dyn Fn(&str) -> Option<u64>) -> Option<u64> {
    let mut found: Vec<u64> = Vec::new();
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let (base, file) = match controllers {
            "" => ("/sys/fs/cgroup", "memory.max"),
            c if c.split(',').any(|x| x == "memory") => {
                ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
            }
            _ => continue,
        };
        // The process's own cgroup, then each ancestor up to the root.
        let mut dir = path.trim_end_matches('/').to_string();
        loop {
            found.extend(read(&format!("{base}{dir}/{file}")));
            match dir.rfind('/') {
                Some(i) => dir.truncate(i),
                None => break,
            }
        }
    }
    found.into_iter().filter(|&l| l < (1u64 << 60)).min()
}

impl Memory {
    /// Reads `/proc/meminfo` and the cgroup (v2, then v1) limit; zeros when unknown.
    pub fn read() -> Memory {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let field = |k: &str| kb_field(&meminfo, k);
        let read_u64 = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let cgroup_limit = cgroup_limit(
            &std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default(),
            &read_u64,
        );
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

    /// The smallest of `MemAvailable`, the cgroup limit and `MemTotal` (unknown ones ignored),
    /// and which one it is.
    pub fn limit(&self) -> (u64, &'static str) {
        let mut best = (self.total, "MemTotal");
        if self.available > 0 && self.available < best.0 {
            best = (self.available, "MemAvailable");
        }
        if let Some(c) = self.cgroup_limit.filter(|&c| c < best.0) {
            best = (c, "cgroup limit");
        }
        best
    }
}

/// This process's resident memory now (`VmRSS`) and at its peak (`VmHWM`), in bytes.
pub fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (kb_field(&status, "VmRSS:"), kb_field(&status, "VmHWM:"))
}

/// The `key  N kB` line of a `/proc` file, in bytes (0 when absent).
fn kb_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
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

/// Bytes held back for the OS, the page cache's working set and allocator slack, out of the
/// memory limit: a tenth of it, at least `min(1.5 GB, a quarter)`. The limit already excludes
/// what other processes use (`MemAvailable`), so this is smaller than Deltafin's
/// `max(10 GB, 18%)` of physical memory; a fixed 1.5 GB floor would leave a 2 GB limit a
/// 0.5 GB budget, so below 6 GB the floor scales with the limit (`--reserve-gb` overrides).
pub fn reserve(limit: u64) -> u64 {
    (limit / 10).max((3 * GB / 2).min(limit / 4))
}

/// Allocations of at least this many bytes get their own mapping (`bound_allocator`).
pub const MMAP_THRESHOLD: usize = 4 << 20;

/// Fixes glibc's mmap threshold at `MMAP_THRESHOLD`. By default glibc raises the threshold to
/// the size of each large block freed (up to 32 MiB), after which 17.5 MB expert buffers and
/// multi-MB activations come from the heap and freed ones stay resident as fragments: a 512-token
/// prefill on a 4-layer full-shape prefix peaked at 12.2–13.6 GB that way against 10.9 GB with
/// the threshold fixed (`bench prefill`, issue 28), so the peak depended on the routing. With a
/// fixed threshold every large buffer is unmapped when freed, whatever the routes. Also turns
/// glibc's fastbins off, so small freed chunks coalesce and `malloc_trim` can return them (the
/// server trims after a connection storm; with fastbins 0–11 MB of a 20 MB storm stayed
/// resident in about half the storms; `run` decoded at 294 against 286 ms per token, no
/// measurable cost). Elsewhere (macOS, musl) it does nothing.
pub fn bound_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_MXFAST, 0);
    }
}

/// Resets this process's peak resident memory (`VmHWM`) to its current RSS, so a later `rss()`
/// reports the peak of what ran since (Linux; elsewhere it does nothing and says so).
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

#[cfg(test)]
mod cgroup_tests {
    use super::cgroup_limit;

    #[test]
    fn the_tightest_limit_of_the_own_cgroup_and_its_ancestors() {
        let files = |p: &str| match p {
            "/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes" => Some(8 << 30),
            "/sys/fs/cgroup/memory/a/memory.limit_in_bytes" => Some(4 << 30),
            "/sys/fs/cgroup/memory/memory.limit_in_bytes" => Some(u64::MAX >> 1),
            "/sys/fs/cgroup/x/memory.max" => Some(2 << 30),
            _ => None,
        };
        assert_eq!(cgroup_limit("4:memory:/a/b\n0::/\n", &files), Some(4 << 30));
        assert_eq!(cgroup_limit("0::/x\n", &files), Some(2 << 30));
        assert_eq!(cgroup_limit("4:memory:/\n2:cpu:/a\n", &files), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_limit_wins() {
        let m = Memory {
            total: 64 * GB,
            available: 50 * GB,
            cgroup_limit: None,
        };
        assert_eq!(m.limit(), (50 * GB, "MemAvailable"));
        let boxed = Memory {
            cgroup_limit: Some(32 * GB),
            ..m
        };
        assert_eq!(boxed.limit(), (32 * GB, "cgroup limit"));
        assert_eq!(boxed.effective_total(), 32 * GB);
        let unknown = Memory {
            total: 8 * GB,
            available: 0,
            cgroup_limit: None,
        };
        assert_eq!(unknown.limit(), (8 * GB, "MemTotal"));
        assert_eq!(reserve(8 * GB), 3 * GB / 2);
        assert_eq!(reserve(2 * GB), GB / 2);
        assert_eq!(reserve(6 * GB), 3 * GB / 2);
        assert_eq!(reserve(100 * GB), 10 * GB);
    }

    #[test]
    fn rss_is_read() {
        let (now, peak) = rss();
        assert!(now > 0 && peak >= now, "{now} {peak}");
    }
}
