//! `deltafin-k3`'s command line: K3's own tools (training K3-tiny and its tokenizer, and the
//! benchmarks of K3's internals: the spine store, the expert store on the K3-slice, layer-major
//! prefill, the prompt cache's K3-shape states, the KDA forms and one MLA layer). The dispatch
//! is `main.rs`; the engine-level commands are the `deltafin` binary's.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// K3's own tools: training, and benchmarks of K3's internals.
#[derive(Debug, Parser)]
#[command(name = "deltafin-k3", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The tools.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print this command line's reference as Markdown (docs/cli-k3.md).
    #[command(hide = true)]
    CliReference,
    /// Train a byte-level BPE tokenizer in K3's format (`tiktoken.model` + `tokenizer_config.json`
    /// with K3's 256 specials after the ranks) on text files, with K3's split pattern.
    TrainTokenizer {
        /// Text files to train on (repeatable).
        #[arg(long = "text", required = true)]
        text: Vec<PathBuf>,
        /// Ranks, the 256 byte tokens included.
        #[arg(long, default_value_t = 8192)]
        vocab: usize,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Train a K3-architecture model (Candle autograd, AdamW) on text files and export it in
    /// K3's format (BF16 spine, MXFP4 experts).
    Train(crate::train::TrainArgs),
    /// Compare a training run's fp32 network with the exported checkpoint as inference runs it
    /// (top-1/top-5 agreement, KL, top-logit change, NLL of both) over a text.
    CompareFp32(crate::train::CompareArgs),
    /// Benchmarks of K3's internals.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        kind: BenchKind,
    },
}

/// Benchmarks of K3's internals, each against a bound measured in the same run.
#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Cold spine layer loads (BF16 and int8) vs raw reads, and the share hidden by read-ahead.
    Spine {
        /// Model directory (the K3-slice fixture; the spine stores are converted if missing).
        #[arg(long)]
        model_root: PathBuf,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Cold expert reads through the tiered store vs raw O_DIRECT sequential reads (K3-slice).
    Experts {
        /// Model directory (the K3-slice fixture).
        #[arg(long)]
        model_root: PathBuf,
        /// Experts read per layer.
        #[arg(long, default_value_t = 16)]
        per_layer: usize,
        /// Reader thread counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        readers: Vec<usize>,
        /// Timed runs per figure.
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Expert wait per token with 1, 2, 4 … emulated storage homes of equal rate vs the ideal.
    Homes {
        /// Model directory (the K3-slice fixture).
        #[arg(long)]
        model_root: PathBuf,
        /// Home counts, comma-separated (the first is the baseline).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        homes: Vec<usize>,
        /// Emulated rate of each home in MB/s.
        #[arg(long, default_value_t = 400.0)]
        rate_mb: f64,
        /// Tokens per run.
        #[arg(long, default_value_t = 4)]
        tokens: usize,
        /// Timed runs.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Scratch directory for the homes (hard links of one populated home; removed after).
        #[arg(long, default_value = "/tmp/deltafin-bench-homes")]
        scratch: PathBuf,
    },
    /// A prompt's prefill, layer-major against the old chunk-major order: bytes read ÷ the
    /// distinct weight bytes it needs, wall time ÷ max(I/O, compute floor), peak RSS vs the plan.
    Prefill {
        /// Model directory (a full-shape fixture or a layer prefix of one).
        #[arg(long)]
        model_root: PathBuf,
        /// Prompt lengths, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "64,512,4096")]
        lengths: Vec<usize>,
        /// Runs per order and length (each on a freshly opened model).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Draw prompt ids below this (default: the vocabulary; the full-shape fixture's
        /// embedding holds data in its first 4,096 rows).
        #[arg(long)]
        id_max: Option<u32>,
        /// Layer-major only (skip the chunk-major comparison).
        #[arg(long)]
        no_chunk_major: bool,
        /// Memory limit in GB (default: the machine's).
        #[arg(long)]
        memory_gb: Option<f64>,
    },
    /// A multi-turn agent transcript (a long system prompt, two clients interleaved, an edited
    /// turn, a restart) with and without the prompt cache: time to first token, tokens
    /// prefilled, bytes read per request; one K3-shape snapshot saved and loaded vs the disk.
    PromptCache {
        /// Model directory (K3-tiny by default; a full-shape layer prefix works too).
        #[arg(long)]
        model_root: Option<PathBuf>,
        /// Tokens of the system prompt.
        #[arg(long, default_value_t = 2000)]
        system_tokens: usize,
        /// Turns, alternating between two clients (then one edited turn, then a restart).
        #[arg(long, default_value_t = 8)]
        turns: usize,
        /// Tokens generated per reply.
        #[arg(long, default_value_t = 8)]
        reply: usize,
        /// Memory limit in GB (default: the machine's).
        #[arg(long)]
        memory_gb: Option<f64>,
        /// Scratch directory (cache files, snapshot files; removed after).
        #[arg(long, default_value = "/tmp/deltafin-bench-prompt-cache")]
        scratch: PathBuf,
        /// Skip the K3-shape snapshot save/load figure.
        #[arg(long)]
        no_snapshot: bool,
    },
    /// Prefill and decode speed with each KDA form (recurrent, chunked 16, chunked 64).
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
        /// Instead: time one MLA layer's decode step with this many positions cached (and what
        /// the step allocates), for each value, comma-separated.
        #[arg(long, value_delimiter = ',')]
        context: Vec<usize>,
        /// Instead: per decode token, compute (attention, MoE), spine and expert wait, bytes
        /// read, and the floor of the same work at the bandwidths measured in the same run.
        #[arg(long)]
        breakdown: bool,
        /// Pin no spine layer (every layer streamed through the template buffers).
        #[arg(long)]
        stream_spine: bool,
        /// Read streamed layers with `O_DIRECT` (as on a machine whose page cache cannot hold
        /// them).
        #[arg(long)]
        cold_spine: bool,
    },
}
