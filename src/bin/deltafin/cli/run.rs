//! `deltafin run`: greedy generation from token ids, raw text, or (`--chat`) one user turn in
//! the model's chat format, on any family, through the engine and a session: the memory plan,
//! speculation, the prompt cache, the observers (router trace, layer profile, prefill progress,
//! expert reuse), Ctrl-C between tokens, and one JSON report (`--json`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;

use deltafin::chat::{encode_marked, ChatOptions, Message};
use deltafin::progress::{PrefillProgress, ProgressMode};
use deltafin::runtime::generate::argmax;
use deltafin::runtime::observers::{ExpertReuse, LayerProfile, RouterTrace};
use deltafin::{Engine, GenerateOptions, Generation, Model};

use super::prompt_cache::{load_engine_cached, PromptCacheArgs};
use super::run_report::{Done, Printer};
pub use super::store::{load_engine, StoreArgs};

/// Arguments of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Model directory: a plain checkpoint as the hub serves it, or an installed model root
    /// (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Prompt text (raw completion, no BOS; with `--chat`, the user message).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required_unless_present = "prompt")]
    pub prompt_ids: Vec<u32>,
    /// Render the prompt as a chat turn (the model's chat format) and run to the end of the
    /// message.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    /// With `--chat`: answer without the think block.
    #[arg(long)]
    pub no_thinking: bool,
    /// With `--chat`: reasoning effort low, medium, high or max, as the chat format offers
    /// them (default: `K3_REASONING_EFFORT`, else the format's default).
    #[arg(long)]
    pub effort: Option<String>,
    /// Most tokens to generate (default: 64 for raw completion, 8192 for chat).
    #[arg(long)]
    pub max_new: Option<usize>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Do not stop at the end-of-message token (generate `--max-new` tokens: measurements).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print per-token expert statistics (tiers, bytes, wait, prefetch hits) on stderr.
    #[arg(long)]
    pub stats: bool,
    /// Print per-layer phase timings of every forward pass on stderr (spine wait, attention,
    /// MLP/MoE with its expert wait, norms and AttnRes).
    #[arg(long)]
    pub layer_profile: bool,
    /// Write the router trace (one JSON line per token) here; `K3_TRACE=buffered` writes
    /// `router_trace.jsonl` in the current directory.
    #[arg(long)]
    pub router_trace: Option<PathBuf>,
    /// Write one JSON line per event (start, each token with its time and expert statistics,
    /// end) to this file.
    #[arg(long)]
    pub events_jsonl: Option<PathBuf>,
    /// Speculative decoding.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Expert store settings.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Prompt cache: `run` uses one only with `--prompt-cache DIR` (a later `run` of a prompt
    /// with the same beginning resumes from the files).
    #[command(flatten)]
    pub cache: PromptCacheArgs,
}

/// Speculative decoding flags (`run`, `serve`): the output is identical either way.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    /// `auto` (n-gram drafts at the depth measured acceptance and pass costs favour, none
    /// where it does not pay), `ngram` (always the full depth when a draft exists) or `off`.
    #[arg(long, default_value = "auto")]
    pub speculate: deltafin::runtime::generate::SpecMode,
    /// Most drafts verified per pass (1..=16).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub spec_depth: u16,
    /// An EAGLE-3 head to draft with (a directory in either published spelling; default: the
    /// model's own `drafter/` when it has one), or `none` for n-gram drafts.
    #[arg(long)]
    pub drafter: Option<PathBuf>,
}

impl SpecArgs {
    /// Sets the engine's drafter: `--drafter`, else the model's installed head; returns the
    /// head's directory (none: n-gram drafts).
    pub fn attach(&self, engine: &mut deltafin::Engine) -> anyhow::Result<Option<PathBuf>> {
        let dir = match &self.drafter {
            Some(d) if d.as_os_str() == "none" => None,
            Some(d) => Some(d.clone()),
            None => deltafin::drafters::installed(engine.root()),
        };
        if let Some(d) = &dir {
            engine.use_drafter(d)?;
            eprintln!("drafter: the EAGLE-3 head in {}", d.display());
        }
        Ok(dir)
    }

    /// The library's settings.
    pub fn speculation(&self) -> deltafin::runtime::generate::Speculation {
        deltafin::runtime::generate::Speculation {
            mode: self.speculate,
            depth: self.spec_depth as usize,
        }
    }
}

/// What speculation did in a run, per decode pass and per emitted token: drafts proposed and
/// accepted, tokens per pass, spine and expert bytes read per emitted token.
fn spec_report(
    model: &dyn Model,
    gen: &Generation,
    args: &SpecArgs,
    after_prefill: deltafin::experts::ExpertStats,
) -> serde_json::Value {
    let s = &gen.spec;
    let emitted = s.emitted.max(1) as f64;
    let d = model
        .expert_stats()
        .unwrap_or_default()
        .since(&after_prefill);
    let per_pass = model.spine_report().map_or(0, |r| r.bytes_read_per_token);
    let spine = per_pass as f64 * s.passes as f64;
    serde_json::json!({
        "mode": args.speculate, "depth": args.spec_depth, "passes": s.passes,
        "verify_passes": s.verify_passes, "drafted": s.drafted, "accepted": s.accepted,
        "tokens_per_pass": s.tokens_per_pass(),
        "spine_bytes_per_token": spine / emitted,
        "expert_bytes_per_token": d.bytes_read() as f64 / emitted,
        "rollback_bytes_max": s.rollback_bytes,
    })
}

/// The observers `run` attaches: the router trace, the layer profile, prefill progress and
/// expert reuse.
struct Watch {
    router_trace: Option<Arc<RouterTrace>>,
    profile: Option<Arc<LayerProfile>>,
    reuse: Option<Arc<ExpertReuse>>,
}

impl Watch {
    fn attach(a: &RunArgs, model: &mut dyn Model) -> anyhow::Result<Watch> {
        let router_trace = match &a.router_trace {
            Some(p) => Some(Arc::new(RouterTrace::create(p)?)),
            None => RouterTrace::from_setting(
                std::env::var("K3_TRACE").ok().as_deref(),
                &std::env::current_dir()?,
            )?
            .map(Arc::new),
        };
        if let Some(rt) = &router_trace {
            model.observe(rt.clone());
        }
        let profile = match (a.layer_profile, model.experts()) {
            (true, Some(e)) => Some(Arc::new(LayerProfile::new(e.clone()))),
            (true, None) => anyhow::bail!("--layer-profile needs a model with routed experts"),
            _ => None,
        };
        if let Some(p) = &profile {
            model.observe(p.clone());
        }
        // Where a long prefill is: a bar on a terminal, else a line every few seconds.
        if !a.json {
            model.observe(Arc::new(PrefillProgress::new(ProgressMode::Terminal)));
        }
        let reuse = a.stats.then(|| Arc::new(ExpertReuse::default()));
        if let Some(r) = &reuse {
            model.observe(r.clone());
        }
        Ok(Watch {
            router_trace,
            profile,
            reuse,
        })
    }
}

/// Ctrl-C sets the returned flag (generation stops between tokens, a prefill between
/// layers); a second one exits at once.
fn cancel_on_ctrl_c() -> Arc<AtomicBool> {
    let cancel = Arc::new(AtomicBool::new(false));
    let c = cancel.clone();
    let _ = ctrlc::set_handler(move || {
        if c.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
    });
    cancel
}

/// The chat options of `--chat` and the prompt ids: the rendered turn, the raw text, or the
/// ids given.
fn prompt(a: &RunArgs, engine: &Engine) -> anyhow::Result<(ChatOptions, Vec<u32>)> {
    let thinking = a.chat && !a.no_thinking;
    let format = engine.chat_format();
    let effort = match thinking {
        true => Some(format.effort(
            a.effort.as_deref(),
            std::env::var("K3_REASONING_EFFORT").ok().as_deref(),
        )?),
        false => None,
    };
    let chat = ChatOptions {
        thinking,
        effort,
        date: Some(super::reply::today()),
        ..Default::default()
    };
    let tok = engine.tokenizer();
    let ids = match &a.prompt {
        Some(p) if a.chat => {
            let (segs, marks) = format.render(&[Message::new("user", p)], &chat)?;
            encode_marked(tok, &segs, &marks).0
        }
        Some(p) => tok.encode_ordinary(p),
        None => a.prompt_ids.clone(),
    };
    if ids.is_empty() {
        anyhow::bail!("the prompt is empty");
    }
    Ok((chat, ids))
}

/// Runs `deltafin run`.
pub fn run(a: &RunArgs) -> anyhow::Result<()> {
    let root = super::default_root(a.model_root.as_deref())?;
    let mut engine = match &a.cache.prompt_cache {
        Some(_) if !a.cache.no_prompt_cache => {
            load_engine_cached(&root, &a.store, &a.cache, Some(1))?
        }
        _ => load_engine(&root, &a.store, 0)?,
    };
    a.spec.attach(&mut engine)?;
    let watch = Watch::attach(a, engine.model_mut())?;
    let cancel = cancel_on_ctrl_c();
    let (chat, prompt_ids) = prompt(a, &engine)?;
    let (model, tok) = (engine.model(), engine.tokenizer());
    let tok = a.prompt.is_some().then_some(tok);
    let gen_opts = GenerateOptions {
        max_new: a.max_new.unwrap_or(if a.chat { 8192 } else { 64 }),
        stop_ids: if a.ignore_eos {
            Vec::new()
        } else {
            engine.stop_ids()
        },
        speculation: a.spec.speculation(),
    };
    let mut events = super::events::Events::create(a.events_jsonl.as_deref())?;
    events.emit(
        "start",
        serde_json::json!({
            "model_root": root.display().to_string(),
            "model": model.describe(),
            "prompt_tokens": prompt_ids.len(),
            "max_new": gen_opts.max_new,
        }),
    )?;
    // The token observers: --stats, the event stream and the layer profile's lines.
    let mut report = super::events::TokenReport::new(model, events, a.stats, watch.profile.clone());
    let mut printer = Printer::new(&engine, a, chat.thinking)?;
    // Expert reads from the first token on (the prefill's are not the decode's).
    let mut after_prefill = None;
    let (read0, mut prefill_read) = (model.bytes_read(), None);
    let mut session = engine.session(chat.clone());
    let gen = session.generate(
        &prompt_ids,
        &gen_opts,
        &cancel,
        &mut |l: &[f32]| argmax(l),
        |id| {
            after_prefill.get_or_insert_with(|| model.expert_stats().unwrap_or_default());
            prefill_read.get_or_insert_with(|| model.bytes_read() - read0);
            report.token(model, id, tok.map(|t| t.decode(&[id])));
            printer.token(id, report.prints());
        },
    )?;
    if let Some(rt) = &watch.router_trace {
        rt.flush()?;
    }
    let spec = spec_report(model, &gen, &a.spec, after_prefill.unwrap_or_default());
    let done = Done {
        gen: &gen,
        prompt_ids: &prompt_ids,
        prefill_read,
        spec,
        with_text: tok.is_some(),
    };
    done.emit_end(report.finish()?, &engine)?;
    printer.finish();
    match a.json {
        true => done.print_json(&engine, a.chat, &chat),
        false => done.print_text(&engine, a, tok.is_none()),
    }
    if a.stats {
        done.print_stats(model, watch.reuse.as_deref());
    }
    super::run_report::print_peak(model);
    Ok(())
}
