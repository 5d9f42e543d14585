//! Loading K3 under the memory plan: sizes every consumer from the config and the checkpoint,
//! computes the `MemoryPlan`, and opens the spine (with the compute device's side) and the
//! expert store (local shards, or the cache and the hub for a streaming install) with the plan's
//! choices (pinned layers, RAM tier, prefetch cap, context limit). Every entry point that runs
//! K3 (the family's `open`, `bench`, `K3Model::from_dir`) comes here; `model` itself only builds
//! from a spine and an expert provider it is handed.

use std::path::Path;
use std::sync::Arc;

use candle::Device;

use super::config::{AttnKind, K3Config};
use super::{K3Model, ModelOptions};
use crate::checkpoint::{ExpertIndex, Inventory};
use crate::experts::{DiskCache, TieredOptions};
use crate::installed::expert_store;
use crate::runtime::load::{CacheRam, LoadOptions};
use crate::runtime::memory::{rss, Memory, MemoryPlan, PlanInputs};
use crate::spine::convert::{is_small, layer_names};
use crate::spine::source::{Spine, SpineOptions};
use crate::Result;

/// Per-sequence bytes: `(fixed, per position)` (KDA conv + recurrent state; MLA latent cache).
pub fn state_bytes(cfg: &K3Config) -> (u64, u64) {
    let t = cfg.text();
    let la = &t.linear_attn_config;
    let p = (la.num_heads * la.head_dim) as u64;
    let kda = (la.num_heads * la.head_dim * la.head_dim) as u64
        + 3 * (la.short_conv_kernel_size.saturating_sub(1)) as u64 * p;
    let (mut fixed, mut per_pos) = (0u64, 0u64);
    for k in &cfg.schedule {
        match k.attn {
            AttnKind::Kda => fixed += 4 * kda,
            AttnKind::Mla => per_pos += 4 * (t.kv_lora_rank + t.qk_rope_head_dim) as u64,
        }
    }
    (fixed, per_pos)
}

/// Activations of one prefill chunk of `chunk` positions (f32), a generous upper estimate: the
/// widest projections of each layer kind live at once, MLA's per-thread partial contexts, and
/// the logits; or of a verify pass of the deepest speculation with its rollback record, when
/// that is larger.
pub fn activation_bytes(cfg: &K3Config, chunk: usize) -> u64 {
    let t = cfg.text();
    let la = &t.linear_attn_config;
    let kw = la.num_heads * la.head_dim;
    let nh = t.num_attention_heads;
    let threads = rayon::current_num_threads().max(1);
    let per_row = 24 * t.hidden_size
        + 12 * kw
        + 3 * t.intermediate_size
        + 4 * cfg.shared_width()
        + 2 * nh * (t.qk_nope_head_dim + t.qk_rope_head_dim)
        + nh * t.kv_lora_rank * (2 + threads)
        + 2 * nh * t.v_head_dim
        + 4 * t.routed_expert_hidden_size * t.num_experts_per_token;
    let prefill = 4 * (chunk * per_row + 2 * t.vocab_size) as u64;
    // A verify pass (speculative decoding): fewer rows, but its rollback record lives for the
    // whole pass, every row's logits are kept, and one KDA state is copied per layer.
    let rows = crate::runtime::generate::spec::MAX_DEPTH + 1;
    // Logits twice (the tensor and the host rows the chooser reads).
    let verify = 4
        * (rows * per_row + 2 * rows * t.vocab_size + la.num_heads * la.head_dim * la.head_dim)
        + rows * crate::models::k3::verify::bytes_per_row(cfg)
        + crate::models::k3::verify::fixed_bytes(cfg);
    prefill.max(verify as u64)
}

/// Bytes a layer-major prefill pass holds per position while a layer runs (f32): the hidden
/// state in, the attention residual, the FFN input or shared-expert output and the state out,
/// every AttnRes block state, and the MoE's latent input, per-slot expert outputs and their sum.
pub fn pass_row_bytes(cfg: &K3Config) -> u64 {
    let t = cfg.text();
    let blocks = cfg.num_layers().div_ceil(t.attn_res_block_size.max(1));
    let k = t.num_experts_per_token;
    let floats = t.hidden_size * (blocks + 4) + t.routed_expert_hidden_size * (k + 2);
    // Each route: k ids and k weights.
    (4 * floats + k * 12) as u64
}

/// The memory plan for the checkpoint `inv` of `cfg` in `dir` on `device`.
pub fn plan_for(
    dir: &Path,
    cfg: &K3Config,
    inv: &Arc<Inventory>,
    device: &Device,
    o: &LoadOptions,
) -> Result<MemoryPlan> {
    let n = cfg.num_layers();
    let (layer_bytes, global_bytes) = Spine::sizes(dir, inv, n, o.spine)?;
    let small_bytes: u64 = (0..n)
        .flat_map(|l| layer_names(inv, l))
        .filter_map(|name| inv.get(&name))
        .filter(|t| is_small(&t.shape))
        .map(|t| t.len() + 4 * t.shape.iter().product::<usize>() as u64)
        .sum();
    let (state_fixed, state_per_position) = state_bytes(cfg);
    let defaults = ModelOptions::default();
    MemoryPlan::new(&PlanInputs {
        memory: Memory::read(),
        limit_override: o.memory_limit,
        layer_bytes,
        global_bytes,
        small_bytes,
        device_copies: crate::compute::spine_device(device).is_some(),
        in_flight: SpineOptions::default().in_flight,
        largest_store_tensor: Spine::largest_store_tensor(dir, inv, n, o.spine)?,
        expert_bytes: cfg.expert_span_bytes() as u64,
        expert_ram: o.expert_ram,
        prefetch: o.store.prefetch_previous,
        pool_buffers: o.store.pool_buffers,
        expert_batch: defaults.expert_batch,
        state_fixed,
        state_per_position,
        context: o.context,
        max_context: cfg.text().max_position_embeddings.unwrap_or(usize::MAX),
        saved_states: o.saved_states,
        batch: o.max_batch,
        prompt_cache: match o.prompt_cache {
            CacheRam::Off => 0,
            // Four snapshots of a 4,096-token sequence.
            CacheRam::Auto => 4 * (state_fixed + 4096 * state_per_position),
            CacheRam::Bytes(b) => b,
        },
        activation_bytes: activation_bytes(cfg, defaults.prefill_chunk),
        pass_row_bytes: pass_row_bytes(cfg),
        prefill_chunk: defaults.prefill_chunk,
        baseline: rss().0,
        resident_cap: o.resident_cap,
        reserve_override: o.memory_reserve,
        spine_resident: false,
    })
}

impl K3Model {
    /// Loads a plain checkpoint directory (config.json + shards) onto `device` under the memory
    /// plan (`K3Model::open` with default `LoadOptions`): the spine from its converted store when
    /// present (else the shards), pinned as far as the plan allows; experts streamed by a
    /// `TieredExperts` store over the local shards.
    pub fn from_dir(dir: &Path, device: &Device) -> Result<Self> {
        Self::open(dir, device, &LoadOptions::default())
    }

    /// `from_dir` with explicit expert-store and spine settings and no memory plan (tests and
    /// benchmarks that choose every size themselves).
    pub fn from_dir_with(
        dir: &Path,
        device: &Device,
        opts: &TieredOptions,
        cache: Option<DiskCache>,
        spine: &SpineOptions,
    ) -> Result<Self> {
        let cfg = K3Config::from_file(&dir.join("config.json"))?;
        let inv = Arc::new(Inventory::from_dir(dir)?);
        let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg)?);
        let mut spine = spine.clone();
        if spine.device_side.is_none() {
            spine.device_side = crate::compute::spine_device(device);
        }
        let spine = Arc::new(Spine::open(
            dir,
            inv.clone(),
            cfg.num_layers(),
            device,
            &spine,
        )?);
        let experts = Arc::new(expert_store(dir, inv, index, opts, cache)?);
        Self::load(cfg, spine, experts)
    }

    /// Loads a checkpoint directory under the memory plan (see `LoadOptions`).
    pub fn open(dir: &Path, device: &Device, o: &LoadOptions) -> Result<Self> {
        Self::open_with(dir, device, o, |p| tracing::info!("{p}"))
    }

    /// `open`, showing the plan to `report` before anything large is read.
    pub fn open_with(
        dir: &Path,
        device: &Device,
        o: &LoadOptions,
        report: impl FnOnce(&MemoryPlan),
    ) -> Result<Self> {
        let cfg = K3Config::from_file(&dir.join("config.json"))?;
        let inv = Arc::new(Inventory::from_dir(dir)?);
        let index = Arc::new(ExpertIndex::derive_k3(&inv, &cfg)?);
        let plan = plan_for(dir, &cfg, &inv, device, o)?;
        report(&plan);
        let spine = Arc::new(Spine::open(
            dir,
            inv.clone(),
            cfg.num_layers(),
            device,
            &SpineOptions {
                choice: o.spine,
                pin: Some(plan.pinned.clone()),
                in_flight: plan.in_flight,
                mapped: plan.mapped_stream,
                device_side: crate::compute::spine_device(device),
                dense: o.dense_kernel,
                ..Default::default()
            },
        )?);
        let streamed = spine.report().bytes_read_per_token;
        let room = plan.limit.saturating_sub(plan.total);
        spine.set_direct(o.direct_spine.unwrap_or(streamed > room));
        let store = TieredOptions {
            ram_budget: plan.expert_ram as usize,
            prefetch_cap: plan.prefetch_cap,
            prefetch_previous: o.store.prefetch_previous && plan.prefetch_cap > 0,
            pool_buffers: plan.pool_buffers,
            ..o.store.clone()
        };
        let experts = Arc::new(expert_store(dir, inv, index, &store, o.cache.clone())?);
        let mut model = Self::load(cfg, spine, experts)?;
        model.context_limit = plan.context;
        model.options.prefill_pass = plan.prefill_pass;
        model.options.expert_batch = plan.expert_batch;
        model.options.kernel = o.kernel;
        model.plan = Some(plan);
        Ok(model)
    }
}
