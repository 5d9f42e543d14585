//! `deltafin setup`, `fetch-experts` and `warm-cache`.

use std::path::PathBuf;

use clap::Args;

use deltafin::install::{
    fetch_experts, missing_experts, parse_layers, setup, warm_plan, SetupOptions,
};
use deltafin::installed::Mode;

/// Arguments of `setup`.
#[derive(Debug, Clone, Args)]
pub struct SetupArgs {
    /// Download every shard (needs room for the whole model).
    #[arg(long, conflicts_with = "stream")]
    pub full: bool,
    /// Download metadata and the spine; fetch routed experts on demand.
    #[arg(long)]
    pub stream: bool,
    /// Print the disk plan and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Hub repository.
    #[arg(long, default_value = "moonshotai/Kimi-K3")]
    pub repo: String,
    /// Revision (branch, tag or commit).
    #[arg(long)]
    pub revision: Option<String>,
    /// Install directory.
    #[arg(long, default_value = "k3")]
    pub model_root: PathBuf,
    /// Also install the EAGLE-3 draft head in this hub repository (either published
    /// spelling) into MODEL_ROOT/drafter, where `run`, `serve` and the chat example use it.
    #[arg(long)]
    pub drafter: Option<String>,
    /// With `--drafter`: only the drafter (the model is already installed).
    #[arg(long, requires = "drafter")]
    pub drafter_only: bool,
}

/// Runs `setup`.
pub fn run_setup(a: &SetupArgs) -> anyhow::Result<()> {
    if a.drafter_only {
        return setup_drafter(a);
    }
    let mode = match (a.full, a.stream) {
        (true, _) => Some(Mode::Full),
        (_, true) => Some(Mode::Stream),
        _ => None,
    };
    let opts = SetupOptions {
        repo: a.repo.clone(),
        revision: a.revision.clone(),
        root: a.model_root.clone(),
        mode,
        dry_run: a.dry_run,
    };
    let plan = setup(&opts, |m| eprintln!("{m}"))?;
    if a.dry_run {
        println!("{}", serde_json::to_string(&plan)?);
    } else {
        eprintln!(
            "installed {} ({:?}) in {}",
            a.repo,
            plan.mode,
            a.model_root.display()
        );
        if a.drafter.is_some() {
            setup_drafter(a)?;
        }
    }
    Ok(())
}

/// Installs `--drafter` into the model root.
fn setup_drafter(a: &SetupArgs) -> anyhow::Result<()> {
    if let Some(repo) = &a.drafter {
        deltafin::install::install_drafter(repo, None, None, &a.model_root, |m| eprintln!("{m}"))?;
    }
    Ok(())
}

/// Arguments of `fetch-experts`.
#[derive(Debug, Clone, Args)]
pub struct FetchArgs {
    /// Install directory.
    #[arg(long, default_value = "k3")]
    pub model_root: PathBuf,
    /// Only these MoE layers, e.g. `1-40,45`.
    #[arg(long)]
    pub layers: Option<String>,
    /// Print what is missing and stop.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `fetch-experts`.
pub fn run_fetch(a: &FetchArgs) -> anyhow::Result<()> {
    let n = deltafin::install::layer_count(&a.model_root)?;
    let layers = a
        .layers
        .as_deref()
        .map(|s| parse_layers(s, n))
        .transpose()?;
    let todo = missing_experts(&a.model_root, layers.as_deref())?;
    let (n, bytes): (usize, u64) = todo
        .iter()
        .fold((0, 0), |(n, b), t| (n + t.1.len(), b + t.2));
    println!(
        "{}",
        serde_json::json!({"missing_experts": n, "missing_bytes": bytes, "layers": todo.len()})
    );
    if !a.dry_run && n > 0 {
        fetch_experts(&a.model_root, &todo)?;
        eprintln!("fetched {n} experts ({:.2} GB)", bytes as f64 / 1e9);
    }
    Ok(())
}

/// Arguments of `warm-cache`.
#[derive(Debug, Clone, Args)]
pub struct WarmArgs {
    /// Install directory.
    #[arg(long, default_value = "k3")]
    pub model_root: PathBuf,
    /// Router traces (`router_trace.jsonl`, from `run --router-trace` or `K3_TRACE=buffered`).
    #[arg(long = "trace", required = true)]
    pub traces: Vec<PathBuf>,
    /// Fetch the N most-selected absent experts (default: print the plan only).
    #[arg(long)]
    pub fetch: Option<usize>,
}

/// Runs `warm-cache`.
pub fn run_warm(a: &WarmArgs) -> anyhow::Result<()> {
    let plan = warm_plan(&a.model_root, &a.traces)?;
    for ((l, e), c) in plan.iter().take(20) {
        println!(
            "{}",
            serde_json::json!({"layer": l, "expert": e, "selections": c})
        );
    }
    eprintln!("{} absent experts were selected in the traces", plan.len());
    if let Some(n) = a.fetch {
        let mut by_layer: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for ((l, e), _) in plan.iter().take(n) {
            by_layer.entry(*l).or_default().push(*e);
        }
        let todo: Vec<(usize, Vec<usize>, u64)> =
            by_layer.into_iter().map(|(l, ids)| (l, ids, 0)).collect();
        fetch_experts(&a.model_root, &todo)?;
        eprintln!("fetched {} experts", plan.len().min(n));
    }
    Ok(())
}

/// Arguments of `populate-home`.
#[derive(Debug, Clone, Args)]
pub struct HomeArgs {
    /// The home directory (on another drive; created if missing).
    pub dir: PathBuf,
    /// Install or model directory whose experts are copied.
    #[arg(long, default_value = "k3")]
    pub model_root: PathBuf,
    /// Copy the N experts most selected in the router traces.
    #[arg(long, conflicts_with = "all", required_unless_present = "all")]
    pub hottest: Option<usize>,
    /// Router traces (`router_trace.jsonl`, from `run --router-trace`), for --hottest.
    #[arg(long = "trace")]
    pub traces: Vec<PathBuf>,
    /// Copy every routed expert (a full mirror).
    #[arg(long)]
    pub all: bool,
}

/// Runs `populate-home`.
pub fn run_home(a: &HomeArgs) -> anyhow::Result<()> {
    use deltafin::install::homes::{populate_home, HomeSelection};
    let sel = match a.hottest {
        Some(n) => HomeSelection::Hottest(n, a.traces.clone()),
        None => HomeSelection::All,
    };
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let c = cancel.clone();
        let _ = ctrlc::set_handler(move || {
            if c.swap(true, std::sync::atomic::Ordering::SeqCst) {
                std::process::exit(130);
            }
        });
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "populate-home [{bar:30}] {pos}/{len} experts eta {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let r = populate_home(&a.model_root, &a.dir, &sel, &cancel, |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    println!("{}", serde_json::to_string(&r)?);
    if !r.recorded {
        eprintln!(
            "{} is not an install (no install.json): pass --storage-home {} to run, serve and chat",
            a.model_root.display(),
            a.dir.display()
        );
    }
    Ok(())
}
