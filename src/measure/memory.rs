//! Memory read bandwidth measured in the same run as a kernel: the bound a dense or expert
//! kernel is compared with. Owns the streaming read and the bound/kernel pairing; no kernel.

use std::time::Instant;

use rayon::prelude::*;

use super::Stats;
use crate::Result;

/// Streaming read of `buf` split over the current pool; returns a checksum so it is not elided.
/// Each thread reads its part as 4 sequential streams in step with 64-byte loads where the CPU
/// has them: one scalar stream per thread left a core's miss queue half empty (21 GB/s on one
/// thread here, below what the GEMV kernels themselves read).
pub fn stream_read(buf: &[u64]) -> u64 {
    let parts = rayon::current_num_threads().max(1);
    let chunk = buf.len().div_ceil(parts);
    buf.par_chunks(chunk)
        .map(|c| {
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") {
                // SAFETY: AVX-512F was detected.
                return unsafe { sum_avx512(c) };
            }
            c.iter().fold(0u64, |a, b| a.wrapping_add(*b))
        })
        .reduce(|| 0, |a, b| a.wrapping_add(b))
}

/// Wrapping sum of `c`, read as 4 streams of 64-byte loads in step.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    const STREAMS: usize = 4;
    let len = c.len() / STREAMS / 8 * 8; // words per stream, whole 64-byte loads
    let p = c.as_ptr();
    let mut acc = [_mm512_setzero_si512(); STREAMS];
    let mut i = 0;
    while i < len {
        for (s, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(p.add(s * len + i) as *const _));
        }
        i += 8;
    }
    let mut total = c[STREAMS * len..]
        .iter()
        .fold(0u64, |a, b| a.wrapping_add(*b));
    for a in acc {
        total = total.wrapping_add(_mm512_reduce_add_epi64(a) as u64);
    }
    total
}

/// Figures of a kernel measured against memory read bandwidth.
pub struct AgainstMemory {
    /// Read bandwidth of streaming the words (GB/s).
    pub bw: Stats,
    /// The kernel's GB/s.
    pub kernel: Stats,
    /// Per-pair ratio kernel / bandwidth (each pair measured back to back).
    pub ratio: Stats,
}

impl AgainstMemory {
    /// The JSON fields of the three figures.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "memory_read_gbps": {"median": self.bw.median, "min": self.bw.min, "max": self.bw.max},
            "median": self.kernel.median, "min": self.kernel.min, "max": self.kernel.max,
            "ratio_to_memory_read": self.ratio.median, "ratio_min": self.ratio.min,
            "ratio_max": self.ratio.max, "pairs": "ABAB (bound, kernel) pairs; ratio = median of per-pair ratios",
        })
    }
}

/// The read bandwidth of streaming `words` and the GB/s of `pass` (which reads `gb` GB), in
/// `runs` interleaved pairs (bound, kernel, bound, kernel, …) after a warm-up of each, in the
/// current pool. The ratio is the median of per-pair ratios: the bandwidth this machine gives
/// drifts between seconds (23 to 52 GB/s seen for one command), so a bound measured in one
/// block before the kernel does not describe the kernel's seconds.
pub fn against_memory(
    words: &[u64],
    runs: usize,
    gb: f64,
    mut pass: impl FnMut() -> Result<()>,
) -> Result<AgainstMemory> {
    let _ = stream_read(words); // warm-up: page in
    pass()?;
    let wgb = std::mem::size_of_val(words) as f64 / 1e9;
    let (mut bw, mut gv, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        std::hint::black_box(stream_read(std::hint::black_box(words)));
        let b = wgb / t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        pass()?;
        let k = gb / t0.elapsed().as_secs_f64();
        bw.push(b);
        gv.push(k);
        ratio.push(k / b);
    }
    Ok(AgainstMemory {
        bw: Stats::of(bw),
        kernel: Stats::of(gv),
        ratio: Stats::of(ratio),
    })
}
