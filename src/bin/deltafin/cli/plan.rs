//! `deltafin plan`: the memory plan a model would be opened under, from its config and shard
//! headers alone (no weight is read), with the same flags `run` and `serve` take, so a budget
//! can be chosen before anything is loaded.

use std::path::PathBuf;

use clap::Args;

use super::store::StoreArgs;

/// `deltafin plan`'s flags.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Model directory (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Sequences whose states the plan charges (as `serve --max-batch`).
    #[arg(long, default_value_t = 1)]
    pub max_batch: usize,
    /// Print the plan as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The memory, store and spine flags of `run`.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Prints the plan, or the refusal naming what does not fit (an error, exit status 1).
pub fn run(a: &PlanArgs) -> anyhow::Result<()> {
    if a.max_batch == 0 {
        anyhow::bail!("--max-batch must be at least 1");
    }
    let root = super::default_root(a.model_root.as_deref())?;
    let family = deltafin::models::family(&root)?;
    let mut opts = a.store.load_options(0)?;
    opts.max_batch = Some(a.max_batch);
    let plan = family.plan(&root, &candle::Device::Cpu, &opts)?;
    if a.json {
        println!("{}", serde_json::to_string(&plan)?);
    } else {
        println!("{} ({})", root.display(), family.name());
        println!("{plan}");
    }
    Ok(())
}
