//! gpt-oss under the runtime's one `MemoryPlan`: what each consumer of a gpt-oss process
//! charges (the mapped dense layers, all resident; lm_head; the key/value rows per position;
//! a prefill pass's activations; the expert reads in flight, the reader pool, the RAM tier and
//! prefetch), and the options that open the model under it. Owns the charges, not the plan's
//! arithmetic (`runtime::memory`).

use crate::checkpoint::Inventory;
use crate::experts::TieredOptions;
use crate::moe::ExecOptions;
use crate::runtime::load::CacheRam;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::{rss, Memory, MemoryPlan, PlanInputs};
use crate::{Error, Result};

use super::config::GptOssConfig;
use super::names;

/// How to open gpt-oss.
#[derive(Debug, Clone, Default)]
pub struct GptOssOptions {
    /// The memory limit (`--memory-gb`), else MemAvailable / cgroup / MemTotal.
    pub memory_limit: Option<u64>,
    /// Expert RAM tier bytes (`--ram-gb`), else the plan's share.
    pub expert_ram: Option<u64>,
    /// Context limit, else the plan's.
    pub context: Option<usize>,
    /// Expert store settings (its RAM budget and prefetch cap come from the plan).
    pub store: TieredOptions,
    /// Extra sequence states the caller keeps.
    pub saved_states: usize,
    /// Sequences decoding at once in shared passes (None: the plan picks, up to 8).
    pub max_batch: Option<usize>,
    /// RAM for the prompt cache's entries.
    pub prompt_cache: CacheRam,
}

impl GptOssOptions {
    /// The engine's load options as gpt-oss's (spine and device choices do not apply: the
    /// dense layers are mapped and resident).
    pub fn from_load(o: &LoadOptions) -> Self {
        GptOssOptions {
            memory_limit: o.memory_limit,
            expert_ram: o.expert_ram,
            context: o.context,
            store: o.store.clone(),
            saved_states: o.saved_states,
            max_batch: o.max_batch,
            prompt_cache: o.prompt_cache,
        }
    }
}

/// Bytes one routed expert occupies (its six parts).
pub fn expert_bytes(cfg: &GptOssConfig) -> u64 {
    names::expert_ffn(cfg).layout().span_bytes()
}

/// Floats of activations one position of a prefill pass holds at once.
fn row_floats(cfg: &GptOssConfig) -> u64 {
    let (h, i) = (cfg.hidden_size as u64, cfg.intermediate_size as u64);
    let qd = (cfg.num_attention_heads * cfg.head_dim) as u64;
    let kd = (cfg.num_key_value_heads * cfg.head_dim) as u64;
    let k = cfg.top_k() as u64;
    // x, its norm, q, k, v, attention out, o; router logits; each selected expert's
    // gate/up and output, and the combined rows.
    4 * h + 3 * qd + 2 * kd + cfg.num_local_experts as u64 + k * (2 * i + h) + h
}

/// The plan for `cfg` with the dense tensors `inv` lists.
pub fn plan(cfg: &GptOssConfig, inv: &Inventory, o: &GptOssOptions) -> Result<MemoryPlan> {
    let layer_bytes: Vec<u64> = (0..cfg.num_hidden_layers)
        .map(|l| {
            inv.dense_layer_names(l)
                .iter()
                .filter_map(|n| inv.get(n))
                .map(|t| t.len())
                .sum()
        })
        .collect();
    let tensor = |n: &str| inv.get(n).map(|t| t.len()).unwrap_or(0);
    let row_width = 2 * cfg.num_key_value_heads * cfg.head_dim;
    let plan = MemoryPlan::new(&PlanInputs {
        memory: Memory::read(),
        limit_override: o.memory_limit,
        layer_bytes,
        global_bytes: tensor(names::LM_HEAD),
        small_bytes: tensor(names::NORM),
        device_copies: false,
        in_flight: 1,
        expert_bytes: expert_bytes(cfg),
        expert_ram: o.expert_ram,
        prefetch: o.store.prefetch_previous,
        pool_buffers: o.store.pool_buffers,
        expert_batch: ExecOptions::default().expert_batch,
        state_fixed: 0,
        state_per_position: (cfg.num_hidden_layers * row_width * 4) as u64,
        context: o.context,
        max_context: cfg.max_position_embeddings,
        saved_states: o.saved_states,
        batch: o.max_batch,
        prompt_cache: match o.prompt_cache {
            CacheRam::Off => 0,
            // Four snapshots of a 4,096-token sequence.
            CacheRam::Auto => 4 * 4096 * (cfg.num_hidden_layers * row_width * 4) as u64,
            CacheRam::Bytes(b) => b,
        },
        // The logits row of the last position, and the lm_head's output.
        activation_bytes: 2 * 4 * cfg.vocab_size as u64,
        pass_row_bytes: 4 * row_floats(cfg),
        prefill_chunk: 64,
        baseline: rss().0,
        resident_cap: None,
    })?;
    // The dense layers are mapped and stay resident: every one must be pinned.
    if plan.pinned_count() < cfg.num_hidden_layers {
        return Err(Error::Msg(format!(
            "gpt-oss keeps its {} dense layers resident, the plan pins {} of them:\n{plan}\nraise --memory-gb or lower --context/--ram-gb",
            cfg.num_hidden_layers,
            plan.pinned_count()
        )));
    }
    Ok(plan)
}

/// The store's options under `plan`.
pub fn store_options(plan: &MemoryPlan, o: &GptOssOptions) -> TieredOptions {
    TieredOptions {
        ram_budget: plan.expert_ram as usize,
        prefetch_cap: plan.prefetch_cap,
        prefetch_previous: o.store.prefetch_previous && plan.prefetch_cap > 0,
        ..o.store.clone()
    }
}
