//! Benchmarks that report each figure against a bound measured in the same run.

pub mod decode;
pub mod dense;
pub mod floor;
pub mod serve;
pub mod speculate;

use std::time::Instant;

use rayon::prelude::*;

use deltafin::checkpoint::rng::Rng;
use deltafin::measure::forward::ForwardBenchOptions;
use deltafin::measure::memory::against_memory;
use deltafin::measure::Stats;
use deltafin::mxfp4::{self, Kernel, Mxfp4Expert};
use deltafin::{Error, Result};

fn pool(threads: usize) -> Result<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| Error::Msg(format!("thread pool: {e}")))
}

/// Options of `bench mxfp4`.
#[derive(Debug, Clone)]
pub struct Mxfp4BenchOptions {
    /// Number of K3-size experts (each 17.55 MB); 64 ≈ 1.1 GB, well above a 300 MB L3.
    pub experts: usize,
    /// Timed runs per figure.
    pub runs: usize,
    /// Thread counts to measure.
    pub threads: Vec<usize>,
    /// Kernel (default: the best this CPU supports).
    pub kernel: Kernel,
    /// Whose expert matrices.
    pub shape: ExpertShape,
    /// Input rows per call (1: decode; more: a prefill pass's tokens routed to one expert).
    pub rows: Vec<usize>,
}

/// The expert matrices `bench mxfp4` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExpertShape {
    /// K3: w1, w3 `[3072, 3584]` and w2 `[3584, 3072]` (17.55 MB).
    K3,
    /// gpt-oss: gate_up `[5760, 2880]` (interleaved) and down `[2880, 2880]` (13.2 MB).
    GptOss,
}

impl ExpertShape {
    /// Each matrix `(rows, cols)` of one expert, in order.
    fn matrices(self) -> Vec<(usize, usize)> {
        match self {
            ExpertShape::K3 => vec![(INTER, LATENT), (INTER, LATENT), (LATENT, INTER)],
            ExpertShape::GptOss => vec![(5760, 2880), (2880, 2880)],
        }
    }
}

impl Default for Mxfp4BenchOptions {
    fn default() -> Self {
        Mxfp4BenchOptions {
            experts: 64,
            shape: ExpertShape::K3,
            runs: 5,
            threads: vec![1, 2],
            kernel: Kernel::best(),
            rows: vec![1],
        }
    }
}

/// K3's expert matrix shapes.
const INTER: usize = 3072;
const LATENT: usize = 3584;

/// Runs the MXFP4 benchmark; calls `emit` with one JSON line per figure: the GEMV figure on
/// the shape's matrices, and for K3 the time of a whole expert with the MoE layer's threading.
pub fn mxfp4_bench(
    opts: &Mxfp4BenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let mats = opts.shape.matrices();
    let (data, span) = expert_bytes(&mats, opts.experts);
    mxfp4_gemv_figure(opts, &mats, &data, span, &mut emit)?;
    if opts.shape != ExpertShape::K3 {
        return Ok(());
    }
    let experts: Vec<Mxfp4Expert> = data
        .chunks(span)
        .map(|s| Mxfp4Expert::from_span(s, INTER, LATENT))
        .collect::<Result<_>>()?;
    let z: Vec<f32> = {
        let mut rng = Rng::new(1);
        (0..LATENT).map(|_| rng.normal() as f32).collect()
    };
    // A full expert (three GEMVs + SiTU) with the MoE layer's own threading (one expert per
    // task, `Mxfp4Expert::forward_all`), on the largest thread count: wall time per expert.
    let t = opts.threads.iter().copied().max().unwrap_or(1);
    let p = pool(t)?;
    let jobs: Vec<(Mxfp4Expert<'_>, &[f32], usize)> =
        experts.iter().map(|e| (*e, &z[..], 1)).collect();
    let ms = p.install(|| -> Result<Stats> {
        let mut v = Vec::new();
        for _ in 0..opts.runs {
            let t0 = Instant::now();
            std::hint::black_box(Mxfp4Expert::forward_all(opts.kernel, &jobs, 4.0, 25.0)?);
            v.push(t0.elapsed().as_secs_f64() * 1e3 / experts.len() as f64);
        }
        Ok(Stats::of(v))
    })?;
    emit(
        serde_json::json!({"figure": "expert_ms", "threads": t, "threading": "one expert per task (as the MoE layer)",
        "median": ms.median, "min": ms.min, "max": ms.max, "expert_bytes": span}),
    );
    Ok(())
}

/// `n` experts of `mats` (each matrix's packed codes, then its scales), random codes, and
/// scale bytes in the band a trained checkpoint has (2^-15 .. 2^0: weights of order 0.01 give
/// 118..124), not uniform over 0..=255: the kernels look a group's decode table up by its
/// scale, so the band sets how much of the 16 KB table stays in L1. Returns the bytes and one
/// expert's span.
fn expert_bytes(mats: &[(usize, usize)], n: usize) -> (Vec<u8>, usize) {
    let sizes: Vec<(usize, usize)> = mats.iter().map(|&(r, c)| (r * c / 2, r * c / 32)).collect();
    let span: usize = sizes.iter().map(|(p, s)| p + s).sum();
    let mut data = vec![0u8; span * n];
    data.par_chunks_mut(1 << 20).enumerate().for_each(|(i, c)| {
        let mut rng = Rng::new(i as u64);
        for b in c.iter_mut() {
            *b = rng.next_u64() as u8;
        }
    });
    data.par_chunks_mut(span).enumerate().for_each(|(i, e)| {
        let mut rng = Rng::new(1 << 32 | i as u64);
        let mut at = 0;
        for (p, s) in &sizes {
            for b in &mut e[at + p..at + p + s] {
                *b = 112 + rng.below(16) as u8;
            }
            at += p + s;
        }
    });
    (data, span)
}

/// The GEMV figure: every matrix of every expert once per run (one input row), against the
/// memory read rate measured in the same run, for each thread count.
fn mxfp4_gemv_figure(
    opts: &Mxfp4BenchOptions,
    mats: &[(usize, usize)],
    data: &[u8],
    span: usize,
    emit: &mut dyn FnMut(serde_json::Value),
) -> Result<()> {
    let mut matrices = Vec::new();
    for e in data.chunks(span) {
        let mut at = 0;
        for &(r, c) in mats {
            let (p, s) = (r * c / 2, r * c / 32);
            matrices.push(mxfp4::Mxfp4Matrix::new(
                &e[at..at + p],
                &e[at + p..at + p + s],
                r,
                c,
            )?);
            at += p + s;
        }
    }
    let width = mats.iter().map(|m| m.0.max(m.1)).max().unwrap_or(0);
    let most = opts.rows.iter().copied().max().unwrap_or(1).max(1);
    let mut rng = Rng::new(1);
    let x: Vec<f32> = (0..width * most).map(|_| rng.normal() as f32).collect();
    // Multiply-adds per weight byte and input row, for the GFLOP/s of a several-row figure.
    let macs: usize = mats.iter().map(|&(r, c)| r * c).sum();
    let macs_per_byte = macs as f64 / span as f64;
    let words: Vec<u64> = (0..data.len() / 8).map(|i| i as u64).collect();
    let gb = data.len() as f64 / 1e9;
    emit(
        serde_json::json!({"bench": "mxfp4", "shape": format!("{:?}", opts.shape),
        "matrices": mats, "expert_bytes": span, "kernel": opts.kernel.effective().name(),
        "requested_kernel": opts.kernel.name(), "experts": opts.experts,
        "working_set_gb": gb, "runs": opts.runs}),
    );
    for &rows in &opts.rows {
        let n = rows.max(1);
        for &t in &opts.threads {
            let fig = pool(t)?.install(|| {
                let mut y = vec![0f32; width * n];
                against_memory(&words, opts.runs, gb, || {
                    for m in &matrices {
                        let (xs, ys) = (&x[..m.cols * n], &mut y[..m.rows * n]);
                        mxfp4::gemm_with(opts.kernel, m, xs, n, ys, true)?;
                    }
                    Ok(())
                })
            })?;
            let mut j = fig.json();
            j["figure"] = if n == 1 {
                "mxfp4_gemv_gbps"
            } else {
                "mxfp4_gemm_gbps"
            }
            .into();
            j["threads"] = t.into();
            j["rows"] = n.into();
            j["gflops"] = (fig.kernel.median * 2.0 * macs_per_byte * n as f64).into();
            emit(j);
        }
    }
    Ok(())
}

/// Times prefill (ms per prompt token) and greedy decode (ms per token) of the model as
/// opened.
pub fn forward_bench(
    model: &dyn deltafin::Model,
    o: &ForwardBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    let (p, d) = deltafin::measure::forward::time_forward(model, o)?;
    emit(
        serde_json::json!({"figure": "prefill_ms_per_token", "prompt_len": o.prompt_len.max(1),
        "median": p.median, "min": p.min, "max": p.max}),
    );
    emit(
        serde_json::json!({"figure": "decode_ms_per_token", "decode": o.decode,
        "median": d.median, "min": d.min, "max": d.max}),
    );
    Ok(())
}
