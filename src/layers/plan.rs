//! A row-cache family under the runtime's one `MemoryPlan` (gpt-oss, Qwen3-MoE): what each
//! consumer of its process charges (the mapped dense layers, all resident; lm_head; the
//! key/value rows per position; a prefill pass's activations; the expert reads in flight, the
//! reader pool, the RAM tier and prefetch), from a `RowShape` the family fills in from its
//! config. Owns the charges, not the plan's arithmetic (`runtime::memory`).

use crate::checkpoint::Inventory;
use crate::experts::TieredOptions;
use crate::moe::ExecOptions;
use crate::runtime::load::CacheRam;
use crate::runtime::load::LoadOptions;
use crate::runtime::memory::{rss, Memory, MemoryPlan, PlanInputs};
use crate::{Error, Result};

/// What the plan needs to know of a row-cache model.
#[derive(Debug, Clone)]
pub struct RowShape {
    /// The family's name (in the error when the model does not fit).
    pub family: &'static str,
    /// Decoder layers.
    pub layers: usize,
    /// Floats of one key/value cache row (one position of one layer).
    pub row_width: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// Floats of activations one position of a prefill pass holds at once.
    pub row_floats: u64,
    /// The most positions the model takes.
    pub max_context: usize,
    /// The output projection's tensor name.
    pub lm_head: String,
    /// The final norm's tensor name.
    pub norm: String,
}

/// The plan for `shape` with the dense tensors `inv` lists.
pub fn plan(shape: &RowShape, inv: &Inventory, o: &LoadOptions) -> Result<MemoryPlan> {
    let layer_bytes: Vec<u64> = (0..shape.layers)
        .map(|l| {
            inv.dense_layer_names(l)
                .iter()
                .filter_map(|n| inv.get(n))
                .map(|t| t.len())
                .sum()
        })
        .collect();
    let tensor = |n: &str| inv.get(n).map(|t| t.len()).unwrap_or(0);
    let (layers, row_width) = (shape.layers, shape.row_width);
    let plan = MemoryPlan::new(&PlanInputs {
        memory: Memory::read(),
        limit_override: o.memory_limit,
        layer_bytes,
        global_bytes: tensor(&shape.lm_head),
        small_bytes: tensor(&shape.norm),
        device_copies: false,
        in_flight: 1,
        largest_store_tensor: None,
        expert_bytes: shape.expert_bytes,
        expert_ram: o.expert_ram,
        prefetch: o.store.prefetch_previous,
        pool_buffers: o.store.pool_buffers,
        expert_batch: ExecOptions::default().expert_batch,
        state_fixed: 0,
        state_per_position: (layers * row_width * 4) as u64,
        context: o.context,
        max_context: shape.max_context,
        saved_states: o.saved_states,
        batch: o.max_batch,
        prompt_cache: match o.prompt_cache {
            CacheRam::Off => 0,
            // Four snapshots of a 4,096-token sequence.
            CacheRam::Auto => 4 * 4096 * (layers * row_width * 4) as u64,
            CacheRam::Bytes(b) => b,
        },
        // The logits row of the last position, and the lm_head's output.
        activation_bytes: 2 * 4 * shape.vocab as u64,
        pass_row_bytes: 4 * shape.row_floats,
        prefill_chunk: 64,
        baseline: rss().0,
        resident_cap: None,
        reserve_override: o.memory_reserve,
        spine_resident: true,
    })
    .map_err(|e| Error::Msg(format!("{}: {e}", shape.family)))?;
    // The dense layers are mapped and stay resident: `spine_resident` pins every one or refuses.
    debug_assert_eq!(plan.pinned_count(), layers);
    Ok(plan)
}

/// The store's options under `plan`.
pub fn store_options(plan: &MemoryPlan, o: &LoadOptions) -> TieredOptions {
    TieredOptions {
        ram_budget: plan.expert_ram as usize,
        prefetch_cap: plan.prefetch_cap,
        prefetch_previous: o.store.prefetch_previous && plan.prefetch_cap > 0,
        pool_buffers: plan.pool_buffers,
        ..o.store.clone()
    }
}

/// What a row-cache family opens under its plan.
pub struct Opened {
    /// The plan (already shown to the caller).
    pub plan: MemoryPlan,
    /// The expert store: local shards (a full install), or the disk cache and the hub (a
    /// streaming one).
    pub experts: std::sync::Arc<dyn crate::experts::ExpertProvider>,
    /// Where the dense tensors are: the shards, or a streaming install's dense copy.
    pub dense: std::sync::Arc<Inventory>,
}

/// Plans `root` for `shape`, shows the plan to `report` before anything large is read, and
/// opens the expert store over `index` under it.
pub fn open(
    root: &std::path::Path,
    shape: &RowShape,
    index: crate::checkpoint::ExpertIndex,
    o: &LoadOptions,
    report: &mut dyn FnMut(&MemoryPlan),
) -> Result<Opened> {
    use std::sync::Arc;
    let inv = Inventory::from_dir(root)?;
    let plan = plan(shape, &inv, o)?;
    report(&plan);
    let inv = Arc::new(inv);
    let opts = store_options(&plan, o);
    let store = crate::installed::expert_store(root, inv.clone(), Arc::new(index), &opts, None)?;
    let streaming = crate::installed::read_manifest(root)
        .is_some_and(|m| m.mode == crate::installed::Mode::Stream);
    let dense = match streaming {
        // The shards are on the hub: the dense tensors come from the install's copy.
        true => Arc::new(Inventory::from_dir(&crate::installed::dense::dense_dir(
            root,
        ))?),
        false => inv,
    };
    Ok(Opened {
        plan,
        experts: Arc::new(store),
        dense,
    })
}
