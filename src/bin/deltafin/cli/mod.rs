//! The `deltafin` command line (clap), a thin layer over the library.

mod bench_args;
mod bench_run;
pub mod doctor;
mod draft_logits;
pub mod eval;
pub mod events;
mod fixture;
pub mod install;
pub mod logits;
mod plan;
pub mod prompt_cache;
pub mod reference;
mod render;
mod reply;
pub mod run;
mod run_report;
mod serve;
pub mod store;
mod train_drafter;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use deltafin::checkpoint::Inventory;

/// Kimi K3 on one machine: streamed MXFP4 experts on Candle.
#[derive(Debug, Parser)]
#[command(name = "deltafin", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a test/benchmark checkpoint in a family's published format (no name: list them).
    Fixture {
        /// The fixture (`nano`, `medium`, `slice`, `k3-full`, `gpt-oss-tiny`, `qwen3-moe`, ...).
        name: Option<String>,
        /// Output directory.
        dir: Option<PathBuf>,
        /// The fixture's options (`--seed N`, ...; `deltafin fixture` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Print the inventory of a checkpoint directory (tensors, shards, expert spans).
    Inventory {
        /// Model directory.
        dir: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Install K3 from the hub: full (every shard) or streaming (spine now, experts on demand).
    Setup(install::SetupArgs),
    /// Fetch a streaming install's missing experts (resumable).
    FetchExperts(install::FetchArgs),
    /// Rank absent experts by how often router traces selected them; fetch with --fetch N.
    WarmCache(install::WarmArgs),
    /// Copy experts (the hottest by router trace, or all) into a storage home on another drive.
    PopulateHome(install::HomeArgs),
    /// Serve a local model directory over the Hugging Face protocol (for trying `setup` offline).
    MockHub {
        /// Directory to serve (e.g. a K3-nano fixture).
        dir: PathBuf,
        /// Repository id it answers to.
        #[arg(long, default_value = "moonshotai/Kimi-K3-nano")]
        repo: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        listen: String,
    },
    /// OpenAI-compatible server (`/v1/models`, `/v1/chat/completions`, `/v1/completions`).
    Serve(serve::ServeArgs),
    /// Generate from a prompt (text, chat, or token ids).
    Run(run::RunArgs),
    /// Print the memory plan a model would be opened under (from its config and shard headers;
    /// no weight is read), with the memory flags of `run`; a plan that does not fit is refused
    /// with what to change.
    Plan(plan::PlanArgs),
    /// Print this command line's reference as Markdown (docs/cli.md).
    #[command(hide = true)]
    CliReference,
    /// Print every prompt position's logits, the routes and a greedy continuation as JSON (for
    /// checks against another implementation).
    Logits(logits::LogitsArgs),
    /// Run one EAGLE-3 draft-head step over given token ids and target rows and print its
    /// logits as JSON (for checks against another implementation of the head).
    Eagle3Logits(draft_logits::Eagle3Args),
    /// Run a DFlash draft head over given token ids and target rows, one block at each given
    /// anchor, and print its logits as JSON (for checks against another implementation).
    DflashLogits(draft_logits::DFlashArgs),
    /// Train an EAGLE-3 draft head for a model on its own greedy continuations and hidden
    /// rows, written in the published layout (resumable; Ctrl-C checkpoints and stops).
    TrainDrafter(train_drafter::TrainDrafterArgs),
    /// Print the prompt ids `serve` would feed for chat request bodies (JSON lines), rendered
    /// in the model's chat format with its tokenizer (no weights are loaded).
    Render(render::RenderArgs),
    /// Check this machine and (with --model-root) an installed model: ok / warn / FAIL lines.
    Doctor(doctor::DoctorArgs),
    /// Convert the spine to row-int8 (resumable; the model then uses it automatically).
    ConvertSpineInt8 {
        /// Model directory (a plain checkpoint or an installed model root).
        #[arg(long)]
        model_root: PathBuf,
    },
    /// Write the BF16 spine store (one sequential read per layer; the original bytes).
    ConvertSpine {
        /// Model directory.
        #[arg(long)]
        model_root: PathBuf,
    },
    /// Write the model's tokenizer as a Hugging Face `tokenizer.json` (byte-level BPE, K3's
    /// split pattern, the specials as added tokens), readable by `tokenizers` anywhere.
    ExportTokenizer {
        /// Model directory (with `tiktoken.model` and `tokenizer_config.json`).
        #[arg(long)]
        model_root: PathBuf,
        /// Output file (default: `tokenizer.json` in the model directory).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Quality harness: teacher-forced NLL and perplexity of a text, a bigram baseline, two
    /// configurations compared (top-1/top-5 agreement, KL, top-logit change), reference
    /// continuations (JSONL).
    Eval(eval::EvalArgs),
    /// Benchmarks.
    Bench {
        /// Which benchmark.
        #[command(subcommand)]
        kind: bench_args::BenchKind,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Fixture { name, dir, args } => fixture::write(name, dir, &args)?,
        Command::Inventory { dir, json } => {
            let inv = Inventory::from_dir(&dir)?;
            let ex = deltafin::models::family(&dir)?.expert_index(&dir, &inv)?;
            let summary = serde_json::json!({
                "shards": inv.shards.iter().map(|s| &s.file).collect::<Vec<_>>(),
                "tensors": inv.len(),
                "skipped_vision_tensors": inv.skipped,
                "experts": ex.count(),
                "contiguous_experts": ex.contiguous_count(),
                "expert_span_bytes": ex.layout.span_bytes(),
                "layers": ex.spans.len(),
                "moe_layers": ex.spans.iter().filter(|s| !s.is_empty()).count(),
            });
            if json {
                println!("{summary}");
            } else {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            }
        }
        Command::Run(a) => run::run(&a)?,
        Command::Plan(a) => plan::run(&a)?,
        Command::CliReference => {
            print!(
                "{}",
                reference::markdown(<Cli as clap::CommandFactory>::command())
            )
        }
        Command::Logits(a) => logits::run(&a)?,
        Command::Eagle3Logits(a) => draft_logits::run(&a)?,
        Command::DflashLogits(a) => draft_logits::run_dflash(&a)?,
        Command::TrainDrafter(a) => train_drafter::run(&a)?,
        Command::Render(a) => render::run(&a)?,
        Command::Doctor(a) => doctor::run(&a)?,
        Command::Serve(a) => serve::serve(&a)?,
        Command::Setup(a) => install::run_setup(&a)?,
        Command::MockHub { dir, repo, listen } => {
            let hub = deltafin::hub::mock::MockHub::start_on(&dir, &repo, &listen)?;
            eprintln!(
                "serving {} as {repo} at {} (set HF_ENDPOINT to it); Ctrl-C stops",
                dir.display(),
                hub.endpoint()
            );
            hub.wait();
        }
        Command::FetchExperts(a) => install::run_fetch(&a)?,
        Command::WarmCache(a) => install::run_warm(&a)?,
        Command::PopulateHome(a) => install::run_home(&a)?,
        Command::ConvertSpineInt8 { model_root } => {
            convert(&model_root, deltafin::spine::convert::SpineFormat::Int8)?
        }
        Command::ConvertSpine { model_root } => {
            convert(&model_root, deltafin::spine::convert::SpineFormat::Bf16)?
        }
        Command::ExportTokenizer { model_root, out } => {
            let tok = deltafin::tokenizer::Tokenizer::from_dir(&model_root)?;
            let json = tok
                .to_hf()?
                .to_string(true)
                .map_err(|e| anyhow::anyhow!("serialising the tokenizer: {e}"))?;
            let out = out.unwrap_or_else(|| model_root.join("tokenizer.json"));
            deltafin::fsio::atomic::write_atomic(&out, json.as_bytes())?;
            eprintln!("wrote {} ({} bytes)", out.display(), json.len());
        }
        Command::Eval(a) => eval::run(&a)?,
        Command::Bench { kind } => bench_run::run(kind)?,
    }
    Ok(())
}

/// `given`, or the built-in K3-tiny when no model root was given (said in one line).
pub fn default_root(given: Option<&std::path::Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(p) => Ok(p.to_path_buf()),
        None => {
            let p = deltafin::assets::k3_tiny()?;
            eprintln!(
                "no --model-root given: using the built-in K3-tiny (a small trained model of K3's architecture) at {}",
                p.display()
            );
            Ok(p)
        }
    }
}

fn convert(
    root: &std::path::Path,
    format: deltafin::spine::convert::SpineFormat,
) -> anyhow::Result<()> {
    let inv = Inventory::from_dir(root)?;
    // Decoder layers: one entry per layer in the family's expert index.
    let n = deltafin::models::family(root)?
        .expert_index(root, &inv)?
        .spans
        .len();
    let bar = indicatif::ProgressBar::new((n + 2) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "converting spine [{bar:30}] {pos}/{len} files, eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    use deltafin::spine::convert::{convert_spine, convert_spine_from, store_dir, SpineFormat};
    let local_shards = inv.shards.iter().all(|s| root.join(&s.file).is_file());
    let bf16 = store_dir(root, SpineFormat::Bf16);
    let fp = deltafin::checkpoint::Source::of(&inv).fingerprint();
    let bf16_complete = deltafin::spine::convert::store_state(root, SpineFormat::Bf16, n, &fp)
        == deltafin::spine::convert::StoreState::Current;
    if !local_shards && !bf16_complete {
        anyhow::bail!(
            "{} has no shards and its BF16 spine store is not complete for this checkpoint ({}): re-run `deltafin setup` to (re)build it",
            root.display(),
            bf16.display()
        );
    }
    let dir = if !local_shards && format == SpineFormat::Int8 && bf16_complete {
        // A streaming install has no shards: its BF16 store holds the original bytes.
        let src = deltafin::spine::convert::StoreTensors::new(bf16, &inv);
        convert_spine_from(&src, &inv, n, root, format, |done, _| {
            bar.set_position(done as u64)
        })?
    } else {
        convert_spine(&inv, n, root, format, |done, _| {
            bar.set_position(done as u64)
        })?
    };
    bar.finish_and_clear();
    eprintln!("spine ({}) written to {}", format.dir_name(), dir.display());
    Ok(())
}
