//! `deltafin eval`: the quality harness (teacher-forced NLL, a bigram baseline, two
//! configurations compared, reference continuations), human-readable or `--json`.

use std::path::PathBuf;

use deltafin::eval::{self, bigram::Bigram, reference, Scorer};
use deltafin::tokenizer::Tokenizer;

use super::store::{load_engine, KernelArg, StoreArgs};

/// Arguments of `deltafin eval`.
#[derive(Debug, clap::Args)]
pub struct EvalArgs {
    /// Model directory (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Text to score (teacher-forced NLL and perplexity).
    #[arg(long)]
    pub text: Option<PathBuf>,
    /// Window length: each window is scored from an empty context.
    #[arg(long, default_value_t = 128)]
    pub window: usize,
    /// Score at most this many tokens of the text.
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Training text of an add-k bigram baseline, scored on the same tokens (repeatable).
    #[arg(long)]
    pub bigram: Vec<PathBuf>,
    /// Compare two configurations of the model over the text: `bf16`, `int8` (spine formats),
    /// `auto`, or `exact`, `fast` (MXFP4 kernels, with the other flags' spine).
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub compare: Vec<String>,
    /// Score the model against reference continuations (JSONL: prompt_ids, continuation,
    /// top_logprobs).
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Write reference continuations of this model to this JSONL file (prompts from --prompts).
    #[arg(long, requires = "prompts")]
    pub write_reference: Option<PathBuf>,
    /// Prompts, one per line, for --write-reference.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Continuation length for --write-reference.
    #[arg(long, default_value_t = 32)]
    pub continuation: usize,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Expert store settings.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// A scorer for configuration `spec` of the model in `root`.
fn scorer(
    root: &std::path::Path,
    store: &StoreArgs,
    spec: &str,
) -> anyhow::Result<Box<dyn Scorer>> {
    let mut s = store.clone();
    match spec {
        "bf16" | "int8" | "auto" => s.spine = spec.to_string(),
        "exact" => s.kernel = KernelArg::Exact,
        "fast" => s.kernel = KernelArg::Fast,
        other => anyhow::bail!(
            "configuration `{other}`: use bf16, int8, auto, exact or fast (a training run's fp32 network: `deltafin-k3 compare-fp32`)"
        ),
    }
    let engine = load_engine(root, &s, 0)?;
    Ok(Box::new(engine.into_model()))
}

/// `store` with half the memory limit (`--memory-gb`, else the measured one).
fn halved(store: &StoreArgs) -> StoreArgs {
    let limit = store
        .memory_gb
        .unwrap_or_else(|| deltafin::runtime::memory::Memory::read().limit().0 as f64 / 1e9);
    StoreArgs {
        memory_gb: Some(limit / 2.0),
        ..store.clone()
    }
}

/// Runs `deltafin eval`.
pub fn run(a: &EvalArgs) -> anyhow::Result<()> {
    let root = super::default_root(a.model_root.as_deref())?;
    let tok = Tokenizer::from_dir(&root)?;
    let mut out = serde_json::json!({ "model_root": root.display().to_string() });
    let text_ids = match &a.text {
        Some(p) => Some(tok.encode_ordinary(&std::fs::read_to_string(p)?)),
        None => None,
    };
    if let Some(ids) = &text_ids {
        out["text"] = a.text.as_ref().map(|p| p.display().to_string()).into();
        if a.compare.is_empty() {
            // The inference model, also counting consecutive-position expert reuse.
            let reuse = std::sync::Arc::new(deltafin::runtime::observers::ExpertReuse::default());
            let mut engine = load_engine(&root, &a.store, 0)?;
            engine.model_mut().observe(reuse.clone());
            let model = engine.into_model();
            let total = eval::windows(ids, a.window, a.max_tokens)
                .iter()
                .map(|w| w.len() - 1)
                .sum::<usize>();
            let bar = deltafin::progress::Bar::bytes(total as u64, "scoring (tokens)");
            let t0 = std::time::Instant::now();
            let r = eval::nll(&model, ids, a.window, a.max_tokens, |n| {
                bar.set_position(n as u64)
            })?;
            bar.finish_and_clear();
            let secs = t0.elapsed().as_secs_f64();
            if !a.json {
                println!(
                    "NLL {:.4} nats/token, perplexity {:.2}, over {} tokens (windows of {}, {:.0} tokens/s)",
                    r.nll,
                    r.perplexity,
                    r.tokens,
                    r.window,
                    r.tokens as f64 / secs
                );
            }
            out["nll"] = serde_json::to_value(&r)?;
            out["seconds"] = secs.into();
            let layers = reuse.per_layer();
            if !layers.is_empty() {
                if !a.json {
                    let per: Vec<String> = layers
                        .iter()
                        .map(|(l, s, _)| format!("L{l} {:.1}%", 100.0 * s))
                        .collect();
                    println!(
                        "expert reuse between consecutive positions: {:.1}% overall; {}",
                        100.0 * reuse.overall(),
                        per.join(", ")
                    );
                }
                out["expert_reuse"] = serde_json::json!({
                    "overall": reuse.overall(),
                    "per_layer": layers.iter().map(|(l, s, _)| serde_json::json!([l, s])).collect::<Vec<_>>(),
                });
            }
        }
        if !a.bigram.is_empty() {
            let mut train = Vec::new();
            for p in &a.bigram {
                train.extend(tok.encode_ordinary(&std::fs::read_to_string(p)?));
            }
            let vocab = tok.num_ranks() as usize;
            let b = Bigram::train(&train, vocab);
            let best = b.best(&eval::windows(ids, a.window, a.max_tokens));
            if !a.json {
                println!(
                    "bigram baseline (add-k, k = {}, {} training tokens): NLL {:.4} nats/token",
                    best.k,
                    train.len(),
                    best.nll
                );
            }
            out["bigram"] = serde_json::to_value(&best)?;
            out["bigram_training_tokens"] = train.len().into();
        }
        if let [sa, sb] = a.compare.as_slice() {
            // Both models are open at once: each plans for half the memory, so the pair fits a
            // machine smaller than one model as a single engine would.
            let half = halved(&a.store);
            let (ma, mb) = (scorer(&root, &half, sa)?, scorer(&root, &half, sb)?);
            let r = eval::compare(ma.as_ref(), mb.as_ref(), ids, a.window, a.max_tokens)?;
            if !a.json {
                println!(
                    "{sa} vs {sb} over {} positions: top-1 agree {:.2}%, top-5 order kept {:.2}% \
                     (first position: {}), KL mean {:.2e} max {:.2e}, |Δ top logit| mean {:.4}, \
                     relative median {:.3}% worst {:.3}% (first {:.3}%), NLL {:.4} vs {:.4}",
                    r.positions,
                    100.0 * r.top1_agreement,
                    100.0 * r.top5_order_kept,
                    r.first_top5_kept,
                    r.kl_mean,
                    r.kl_max,
                    r.top_logit_delta_mean,
                    100.0 * r.top_logit_rel_median,
                    100.0 * r.top_logit_rel_worst,
                    100.0 * r.first_top_logit_rel,
                    r.nll_a,
                    r.nll_b
                );
            }
            out["compare"] = serde_json::json!({ "a": sa, "b": sb, "report": r });
        }
    }
    if let Some(p) = &a.write_reference {
        let prompts_path = a
            .prompts
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("--prompts"))?;
        let prompts: Vec<(Option<String>, Vec<u32>)> = std::fs::read_to_string(prompts_path)?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| (Some(l.to_string()), tok.encode_ordinary(l)))
            .collect();
        let model = scorer(&root, &a.store, &a.store.spine)?;
        let lines = reference::write(model.as_ref(), &prompts, a.continuation, 20)?;
        let mut text = String::new();
        for l in &lines {
            text.push_str(&serde_json::to_string(l)?);
            text.push('\n');
        }
        deltafin::fsio::atomic::write_atomic(p, text.as_bytes())?;
        if !a.json {
            println!(
                "wrote {} reference continuations to {}",
                lines.len(),
                p.display()
            );
        }
        out["wrote_reference"] = p.display().to_string().into();
    }
    if let Some(p) = &a.reference {
        let lines = reference::parse(&std::fs::read_to_string(p)?, &p.display().to_string())?;
        let model = scorer(&root, &a.store, &a.store.spine)?;
        let r = reference::score(model.as_ref(), &lines)?;
        if !a.json {
            println!(
                "against {} reference continuations ({} positions): NLL {:.4} (the reference's own {:.4}), top-1 agree {:.2}%, top-k KL mean {:.3e}",
                r.lines,
                r.positions,
                r.nll,
                r.reference_nll,
                100.0 * r.top1_agreement,
                r.topk_kl_mean
            );
        }
        out["reference"] = serde_json::to_value(&r)?;
    }
    if a.json {
        println!("{out}");
    }
    Ok(())
}
