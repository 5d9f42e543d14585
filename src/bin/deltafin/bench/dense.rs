//! `bench dense`: the spine GEMV (one input row, as in decode, or several, as in a batched
//! pass) on K3-size matrices against the memory read bandwidth measured in the same run, for
//! row-int8 and BF16. With several rows the figure is the weight bytes per second (each
//! weight is read once per call) and the time per input row.

use rayon::prelude::*;

use super::pool;
use deltafin::checkpoint::rng::Rng;
use deltafin::kernels::dense::{gemm, quantize_row_int8, DenseData, DenseKernel, DenseMatrix};
use deltafin::measure::memory::against_memory;
use deltafin::Result;

/// K3's KDA projection shape (`q_proj`: 96 heads × 128 by hidden 7168).
const ROWS: usize = 12288;
const COLS: usize = 7168;

/// Options of `bench dense`.
#[derive(Debug, Clone)]
pub struct DenseBenchOptions {
    /// Bytes of matrices per format (well above the L3).
    pub working_set: usize,
    /// Timed runs per figure.
    pub runs: usize,
    /// Thread counts to measure.
    pub threads: Vec<usize>,
    /// Input rows per call.
    pub rows: Vec<usize>,
    /// The arithmetic to measure (each on both formats).
    pub kernels: Vec<DenseKernel>,
}

impl Default for DenseBenchOptions {
    fn default() -> Self {
        DenseBenchOptions {
            working_set: 1 << 30,
            runs: 5,
            threads: vec![1, 2],
            rows: vec![1],
            kernels: vec![DenseKernel::Exact],
        }
    }
}

/// Runs the benchmark; calls `emit` with one JSON line per figure.
pub fn dense_bench(
    opts: &DenseBenchOptions,
    mut emit: impl FnMut(serde_json::Value),
) -> Result<()> {
    // One row-int8 matrix quantised from random weights, its bytes repeated to fill the set
    // (values do not change the work).
    let mut rng = Rng::new(2);
    let w: Vec<f32> = (0..COLS).map(|_| rng.normal() as f32 * 0.02).collect();
    let (qrow, sc) = quantize_row_int8(&w);
    let most = opts.rows.iter().copied().max().unwrap_or(1);
    let x: Vec<f32> = (0..COLS * most).map(|_| rng.normal() as f32).collect();
    let words: Vec<u64> = (0..opts.working_set / 8).map(|i| i as u64).collect();
    for format in ["int8", "bf16"] {
        let elem = if format == "int8" { 1 } else { 2 };
        let per = ROWS * COLS * elem;
        let n = opts.working_set.div_ceil(per).max(1);
        let mut data = vec![0u8; n * per];
        data.par_chunks_mut(COLS * elem).for_each(|row| {
            if elem == 1 {
                row.iter_mut().zip(&qrow).for_each(|(b, q)| *b = *q as u8);
            } else {
                for (b, v) in row.chunks_exact_mut(2).zip(&w) {
                    b.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
                }
            }
        });
        let scales: Vec<u8> = (0..ROWS).flat_map(|_| sc.to_le_bytes()).collect();
        let mats: Vec<DenseMatrix> = data
            .chunks(per)
            .map(|b| {
                let d = if elem == 1 {
                    DenseData::I8 {
                        q: b,
                        scales: &scales,
                    }
                } else {
                    DenseData::Bf16(b)
                };
                DenseMatrix::new(d, ROWS, COLS)
            })
            .collect::<Result<_>>()?;
        let gb = (n * per) as f64 / 1e9;
        emit(
            serde_json::json!({"bench": "dense", "format": format, "matrix": [ROWS, COLS],
            "matrices": n, "working_set_gb": gb, "runs": opts.runs}),
        );
        for (&t, &r, &k) in opts.threads.iter().flat_map(|t| {
            opts.rows
                .iter()
                .flat_map(move |r| opts.kernels.iter().map(move |k| (t, r, k)))
        }) {
            {
                let p = pool(t)?;
                let fig = p.install(|| {
                    let mut y = vec![0f32; ROWS * r];
                    against_memory(&words, opts.runs, gb, || {
                        for m in &mats {
                            gemm(&m.with_kernel(k), &x[..COLS * r], r, &mut y)?;
                            std::hint::black_box(&y);
                        }
                        Ok(())
                    })
                })?;
                let mut j = fig.json();
                j["figure"] = "dense_gemv_gbps".into();
                j["format"] = format.into();
                j["threads"] = t.into();
                j["rows"] = r.into();
                j["kernel"] = k.effective().name().into();
                // Multiply-adds per second: two flops per weight per input row.
                j["gflops"] =
                    (2.0 * (ROWS * COLS * n * r) as f64 * fig.kernel.median / gb / 1e9).into();
                // Seconds per input row over the whole set, from the median rate.
                j["ms_per_row"] = (gb / fig.kernel.median / r as f64 * 1e3).into();
                emit(j);
            }
        }
    }
    Ok(())
}
