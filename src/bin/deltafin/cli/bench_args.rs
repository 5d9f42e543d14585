//! `deltafin bench ...`: the benchmark subcommands and their flags (the dispatch to
//! `crate::bench` is `bench_run`).

use std::path::PathBuf;

use clap::Subcommand;

/// Benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Prefill and decode speed of the whole model, as opened (a family's own forms and
    /// per-layer figures are in its tools, e.g. `deltafin-k3 bench forward`).
    Forward {
        /// Model directory.
        #[arg(long)]
        model_root: PathBuf,
        /// Prompt length.
        #[arg(long, default_value_t = 64)]
        prompt_len: usize,
        /// Decode steps per run.
        #[arg(long, default_value_t = 32)]
        decode: usize,
        /// Timed runs (after one warm-up run).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Compute device: auto, cpu or metal.
        #[arg(long, value_enum, default_value = "auto")]
        device: deltafin::compute::device::DeviceChoice,
        /// Instead: per decode token, wall time against the I/O floor (bytes from storage ÷
        /// the raw parallel O_DIRECT read rate) and the compute floor (bytes the kernels touch ÷
        /// memory read bandwidth), both measured before each run; median of per-run ratios.
        #[arg(long)]
        floor: bool,
        /// Instead: ms per emitted token with speculative decoding on (`--spec-mode`) and off,
        /// interleaved, on a repetitive and a non-repetitive prompt (or `--text` prompts), with
        /// tokens per pass and acceptance; fails if the outputs differ.
        #[arg(long)]
        speculate: bool,
        /// With `--speculate`: the mode measured against off (auto or ngram).
        #[arg(long, default_value = "auto")]
        spec_mode: deltafin::runtime::generate::SpecMode,
        /// With `--speculate`: most drafts per pass.
        #[arg(long, default_value_t = 8)]
        spec_depth: usize,
        /// With `--speculate`: prompts from this text file instead (up to 10 windows of
        /// `--prompt-len` tokens, spread over the file; needs the model's tokenizer).
        #[arg(long)]
        text: Option<PathBuf>,
        /// With `--speculate --text`: the prompts are 10 sentences of the text, each a user
        /// message in the model's chat format (the reply is what is decoded).
        #[arg(long)]
        chat_prompts: bool,
        /// With `--speculate`: draft with this EAGLE-3 head (default: the n-gram drafter).
        #[arg(long)]
        drafter: Option<PathBuf>,
        /// Pin no spine layer (every layer streamed through the template buffers).
        #[arg(long)]
        stream_spine: bool,
        /// Drop the model's files from the page cache at the start of every pass (reads come
        /// from the disk, as on a machine smaller than the model).
        #[arg(long)]
        cold_spine: bool,
        /// With `--speculate`: also time the plain run's own continuation as drafts (every
        /// draft right; the bound of the verify pass, not a drafter).
        #[arg(long)]
        oracle_drafts: bool,
        /// With `--floor` on mapped dense weights: the expert RAM tier in GB (default: the
        /// plan's share).
        #[arg(long)]
        ram_gb: Option<f64>,
    },
    /// Concurrent streams through the batch scheduler: aggregate tokens/s, per-request ms per
    /// token (median, p95), spine and expert bytes per emitted token for each batch size, the
    /// ratio to one stream beside the byte formula's, and the decode gaps a newcomer's
    /// interleaved prefill adds.
    Serve {
        /// Model directory (default: the built-in K3-tiny).
        #[arg(long)]
        model_root: Option<PathBuf>,
        /// Concurrent streams to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        batches: Vec<usize>,
        /// Prompt tokens per stream.
        #[arg(long, default_value_t = 16)]
        prompt_len: usize,
        /// Tokens decoded per stream.
        #[arg(long, default_value_t = 8)]
        decode: usize,
        /// Timed runs per batch size (interleaved).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Pin no spine layer (every layer streamed through the template buffers).
        #[arg(long)]
        stream_spine: bool,
        /// Drop the model's files from the page cache at every pass, no expert RAM tier:
        /// every byte from the disk, as on a machine smaller than the model.
        #[arg(long)]
        cold_spine: bool,
        /// Prompt tokens of the newcomer whose prefill is interleaved with two decoding
        /// streams (0: skip that figure).
        #[arg(long, default_value_t = 512)]
        interleave_prompt: usize,
        /// Prompt tokens per pass beside the decode rows (the server's --prefill-tokens).
        #[arg(long, default_value_t = 256)]
        prefill_tokens: usize,
        /// Draw prompt ids below this (the full-shape fixture's data rows: 4096).
        #[arg(long)]
        id_max: Option<u32>,
    },
    /// Spine GEMV (row-int8 and BF16, one input row or several) on K3-size matrices vs the
    /// measured memory read bandwidth.
    Dense {
        /// GB of matrices per format.
        #[arg(long, default_value_t = 1.0)]
        gb: f64,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Thread counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Input rows per call (1: decode; more: a batched pass), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        rows: Vec<usize>,
        /// Arithmetic to measure, comma-separated: exact, fast (fused multiply-adds with
        /// AVX-512F on x86-64 and NEON on ARM64; elsewhere exact).
        #[arg(long, value_enum, value_delimiter = ',', default_value = "exact")]
        kernel: Vec<super::store::KernelArg>,
    },
    /// Fused MXFP4 GEMV on K3-size expert matrices vs the measured memory read bandwidth.
    Mxfp4 {
        /// K3-size experts in the working set (17.55 MB each).
        #[arg(long, default_value_t = 64)]
        experts: usize,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Kernel: scalar, avx2, avx512, neon, int8, avx512-vnni, neon-dot, neon-int8 (default: the
        /// best exact one).
        #[arg(long)]
        kernel: Option<String>,
        /// Thread counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        threads: Vec<usize>,
        /// Whose expert matrices: k3 or gpt-oss.
        #[arg(long, value_enum, default_value = "k3")]
        shape: crate::bench::ExpertShape,
        /// Input rows per call (1: decode; more: a prefill pass's tokens on one expert),
        /// comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1")]
        rows: Vec<usize>,
    },
}
