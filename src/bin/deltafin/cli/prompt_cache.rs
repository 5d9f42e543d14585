//! The prompt-cache flags of `run` and `serve`, and attaching the cache to an opened engine.

use std::path::{Path, PathBuf};

use clap::Args;

use deltafin::engine::prompt_cache::PromptCacheOptions;
use deltafin::runtime::load::CacheRam;
use deltafin::Engine;

use super::store::{load_engine_with, StoreArgs};

/// Prompt-cache settings.
#[derive(Debug, Clone, Args)]
pub struct PromptCacheArgs {
    /// Keep prompt-cache entries in this directory too (written as they are made, loaded after
    /// a restart; files from another checkpoint are refused, damaged ones removed).
    #[arg(long)]
    pub prompt_cache: Option<PathBuf>,
    /// RAM for prompt-cache entries in GiB (default: four snapshots of a 4,096-token sequence;
    /// a line of the memory plan).
    #[arg(long)]
    pub prompt_cache_gb: Option<f64>,
    /// Most GiB the prompt-cache directory may hold (least recently used files go first).
    #[arg(long, default_value_t = 64.0)]
    pub prompt_cache_disk_gb: f64,
    /// Save an entry every this many tokens of a long prompt (0: only at message ends and
    /// prompt ends).
    #[arg(long, default_value_t = 2048)]
    pub prompt_cache_every: usize,
    /// No prompt cache (every request prefills its whole prompt).
    #[arg(long)]
    pub no_prompt_cache: bool,
}

impl PromptCacheArgs {
    /// The plan's RAM line for these flags.
    pub fn ram(&self) -> anyhow::Result<CacheRam> {
        Ok(match (self.no_prompt_cache, self.prompt_cache_gb) {
            (true, _) => CacheRam::Off,
            (false, None) => CacheRam::Auto,
            (false, Some(g)) if g >= 0.0 && g.is_finite() => {
                CacheRam::Bytes((g * (1u64 << 30) as f64) as u64)
            }
            (false, Some(_)) => anyhow::bail!("--prompt-cache-gb must be a non-negative number"),
        })
    }
}

/// Opens the engine under the memory plan (the prompt cache one of its lines) and attaches the
/// cache the flags describe.
pub fn load_engine_cached(
    root: &Path,
    store: &StoreArgs,
    cache: &PromptCacheArgs,
    max_batch: Option<usize>,
) -> anyhow::Result<Engine> {
    let mut engine = load_engine_with(root, store, (0, max_batch), cache.ram()?)?;
    if cache.no_prompt_cache {
        return Ok(engine);
    }
    let ram_bytes = engine.model().plan().map_or(1 << 30, |p| p.prompt_cache);
    let opts = PromptCacheOptions {
        ram_bytes,
        dir: cache.prompt_cache.clone(),
        disk_bytes: (cache.prompt_cache_disk_gb.max(0.0) * (1u64 << 30) as f64) as u64,
        every: cache.prompt_cache_every,
    };
    engine.enable_prompt_cache(opts)?;
    if let Some(d) = &cache.prompt_cache {
        if let Some(c) = engine.prompt_cache() {
            let s = c.stats();
            eprintln!(
                "prompt cache: {} ({} entries, {:.2} GB on disk; {} refused, {} damaged removed)",
                d.display(),
                s.disk_entries,
                s.disk_bytes as f64 / 1e9,
                s.refused,
                s.removed_corrupt
            );
        }
    }
    Ok(engine)
}
