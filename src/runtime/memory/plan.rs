//! `MemoryPlan`: one budget, computed once at startup, that charges every consumer before any
//! layer is pinned: the process baseline, small tensors, lm_head and the tail, pinned layers
//! (twice with a device copy), streamed layers in flight, the expert RAM tier, prefetch holdings,
//! expert reads in flight, the reader pool's idle buffers, per-sequence state at the chosen
//! context (and the server's saved states), prefill activations, and the OS reserve. Pure
//! arithmetic over `PlanInputs`, so every rule is unit-tested.

use super::plan_choices::{choose_context, choose_pass, gb, pin_layers, too_small};
use super::{reserve, Memory};
use crate::{Error, Result};

/// Everything the plan charges, measured or derived from the config and the checkpoint.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    /// This machine's memory.
    pub memory: Memory,
    /// `--memory-gb`: replaces the measured limit (for testing smaller machines).
    pub limit_override: Option<u64>,
    /// `--reserve-gb`: replaces the OS reserve `reserve(limit)` would hold back.
    pub reserve_override: Option<u64>,
    /// The family keeps every spine layer resident (mapped dense layers): they are charged
    /// before the RAM tier and prefetch, which get only what is left.
    pub spine_resident: bool,
    /// Spine bytes of each decoder layer.
    pub layer_bytes: Vec<u64>,
    /// lm_head and the tail norms (always resident).
    pub global_bytes: u64,
    /// Small per-layer tensors (norms, conv weights) as loaded.
    pub small_bytes: u64,
    /// Pinned data also has a device copy (Metal): charged twice.
    pub device_copies: bool,
    /// Streamed layers held at once (the one computing and the one read ahead).
    pub in_flight: usize,
    /// The largest tensor of any layer when the spine comes from store files, which a plan too
    /// tight for one streamed layer maps instead of reading (charged this much, the matrix
    /// being read, in the page cache); `None`: gathered from the shards, never mapped.
    pub largest_store_tensor: Option<u64>,
    /// Bytes of one routed expert.
    pub expert_bytes: u64,
    /// `--ram-gb` (None: the plan sizes the RAM tier).
    pub expert_ram: Option<u64>,
    /// Whether prefetch runs.
    pub prefetch: bool,
    /// Idle expert buffers the reader pool keeps.
    pub pool_buffers: usize,
    /// Experts one MoE layer holds at once.
    pub expert_batch: usize,
    /// Per-sequence state that does not grow with the context (KDA).
    pub state_fixed: u64,
    /// Per-sequence bytes per position (MLA latent cache).
    pub state_per_position: u64,
    /// `--context` (None: the plan picks the largest power of two that fits its share).
    pub context: Option<usize>,
    /// The config's `max_position_embeddings`.
    pub max_context: usize,
    /// Extra sequence states kept (the server's saved conversation).
    pub saved_states: usize,
    /// Sequences decoding at once in shared passes (`--max-batch`; None: the plan picks).
    pub batch: Option<usize>,
    /// RAM for the prompt cache's entries (0: no cache).
    pub prompt_cache: u64,
    /// Activations of one prefill chunk.
    pub activation_bytes: u64,
    /// Bytes a layer-major prefill pass holds per position across a layer (hidden states,
    /// AttnRes block states, routed-expert outputs).
    pub pass_row_bytes: u64,
    /// Rows per prefill chunk (a pass holds whole chunks).
    pub prefill_chunk: usize,
    /// Resident memory before the model loads (code, inventory, tokenizer), measured.
    pub baseline: u64,
    /// `--spine-resident-gb`: most bytes of layers to pin (None: what fits).
    pub resident_cap: Option<u64>,
}

/// One consumer of the budget.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PlanLine {
    /// What it is.
    pub what: String,
    /// Bytes charged.
    pub bytes: u64,
}

/// The plan: the limit, the reserve, every charge, and the choices made from them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryPlan {
    /// The memory limit in bytes.
    pub limit: u64,
    /// Where the limit came from (`MemAvailable`, `cgroup limit`, `MemTotal`, `--memory-gb`).
    pub limit_source: String,
    /// Bytes held back for the OS.
    pub reserve: u64,
    /// Every charge.
    pub lines: Vec<PlanLine>,
    /// Sum of the charges: what this process may hold at its peak.
    pub total: u64,
    /// Which layers are pinned.
    #[serde(skip)]
    pub pinned: Vec<bool>,
    /// Context limit in tokens.
    pub context: usize,
    /// Most positions one layer-major prefill pass holds.
    pub prefill_pass: usize,
    /// Expert RAM tier in bytes.
    pub expert_ram: u64,
    /// Prefetch holdings cap in bytes (0: prefetch off).
    pub prefetch_cap: u64,
    /// RAM for the prompt cache's entries.
    pub prompt_cache: u64,
    /// Sequences that may decode at once in shared passes (each one's state is charged).
    pub max_batch: usize,
    /// Experts one MoE layer holds at once: the family's, halved (down to 1) while the model
    /// would not fit otherwise (a prefill pass then runs its experts in smaller groups).
    pub expert_batch: usize,
    /// Idle buffers the expert readers keep, halved with `expert_batch`.
    pub pool_buffers: usize,
    /// Streamed spine layers held at once: the family's (2: one computing, the next being
    /// read), or 1 where two would not fit (the next layer is read after this one is done).
    pub in_flight: usize,
    /// Streamed layers are mapped from the store for each pass, not read into buffers: the
    /// budget holds less than one layer (`SpineOptions::mapped`).
    pub mapped_stream: bool,
}

/// Why a plan was not made: the model's floor is over the budget (a smaller expert batch may
/// still fit), or anything else.
enum Refusal {
    Floor(Error),
    Other(Error),
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal::Other(e)
    }
}

/// Share of the budget the batch's sequence states may take when the plan picks the batch.
const BATCH_SHARE: u64 = 4;
/// Largest batch the plan picks on its own.
const MAX_AUTO_BATCH: usize = 8;

/// Experts the prefetch may hold at most (four layers' worth of a K3 token).
const PREFETCH_EXPERTS: u64 = 64;

/// The costs that do not depend on the context or the pass: baseline, small tensors, the tail,
/// activations, expert reads in flight and the reader pool.
fn fixed_lines(i: &PlanInputs, copies: u64) -> Vec<(String, u64)> {
    vec![
        (
            "process baseline (code, inventory, tokenizer)".to_string(),
            i.baseline,
        ),
        ("small tensors (norms, conv, gates)".into(), i.small_bytes),
        ("lm_head and tail".into(), i.global_bytes * copies),
        (
            "activations (a prefill chunk or a verify pass)".into(),
            i.activation_bytes,
        ),
        (
            format!("expert reads in flight ({} experts)", i.expert_batch),
            i.expert_batch as u64 * i.expert_bytes,
        ),
        (
            format!("reader pool idle buffers ({})", i.pool_buffers),
            i.pool_buffers as u64 * i.expert_bytes,
        ),
        ("prompt cache (RAM entries)".into(), i.prompt_cache),
    ]
}

/// The expert RAM tier and the prefetch cap from what the fixed costs leave (`spare`). The
/// tier: `--ram-gb` when it fits, else a fifth of `spare` (at most 4 GiB; the rest pins
/// layers), or, where the spine is resident anyway (nothing left to pin), all but the prefetch
/// cap. The prefetch: 64 experts, at most a tenth of what the tier leaves (of `spare` with a
/// resident spine); none if that is below one expert.
fn tier_and_prefetch(i: &PlanInputs, spare: u64) -> Result<(u64, u64)> {
    let cap = |room: u64| match (PREFETCH_EXPERTS * i.expert_bytes).min(room / 10) {
        // A cap below one expert could never start a read: prefetch is off.
        c if i.prefetch && c >= i.expert_bytes => c,
        _ => 0,
    };
    if i.spine_resident && i.expert_ram.is_none() {
        let prefetch = cap(spare);
        return Ok((spare - prefetch, prefetch));
    }
    let tier = expert_tier(i.expert_ram, spare)?;
    Ok((tier, cap(spare - tier)))
}

/// The expert RAM tier beside a spine that pins layers, or asked for: `--ram-gb` when it fits
/// in `spare`, else a fifth of `spare` (at most 4 GiB).
fn expert_tier(asked: Option<u64>, spare: u64) -> Result<u64> {
    match asked {
        Some(r) if r > spare => Err(Error::Msg(format!(
            "--ram-gb {:.2} does not fit: {:.2} GB is left after the fixed costs (see the memory plan); lower --ram-gb",
            r as f64 / (1u64 << 30) as f64,
            gb(spare)
        ))),
        Some(r) => Ok(r),
        None => Ok((spare / 5).min(4 << 30)),
    }
}

impl MemoryPlan {
    /// Computes the plan; an error names what does not fit and the flags that change it.
    pub fn new(i: &PlanInputs) -> Result<MemoryPlan> {
        // A tight budget holds fewer expert reads at once, then (reading the next spine layer
        // only after the current one is done) one streamed layer, then (from the store) maps
        // the streamed layers, before the model is refused.
        let mut refusal = None;
        let mut tries = vec![(i.in_flight.max(1), None)];
        // On Metal the device keeps a template per layer kind whatever the host holds, so one
        // host layer in flight would save less than the charge assumes: not tried there.
        if i.in_flight > 1 && !i.device_copies {
            tries.push((1, None));
        }
        if let (Some(t), false) = (i.largest_store_tensor, i.device_copies || i.spine_resident) {
            tries.push((1, Some(t)));
        }
        for (depth, mapped) in tries {
            let mut j = i.clone();
            j.in_flight = depth;
            loop {
                match Self::within(&j, mapped) {
                    Ok(p) => return Ok(p),
                    Err(Refusal::Floor(_)) if j.expert_batch > 1 || j.pool_buffers > 1 => {
                        j.expert_batch = (j.expert_batch / 2).max(1);
                        j.pool_buffers = (j.pool_buffers / 2).max(1);
                    }
                    Err(Refusal::Floor(e)) => {
                        // The last refusal (the least streaming memory) names the minimum.
                        refusal = Some(e);
                        break;
                    }
                    Err(Refusal::Other(e)) => return Err(e),
                }
            }
        }
        let e = refusal.unwrap_or_else(|| Error::Msg("no memory plan fits".into()));
        match e {
            // Gathered from the shards, the spine cannot be mapped: say what would allow it.
            Error::Msg(m)
                if i.largest_store_tensor.is_none() && !i.spine_resident && !i.device_copies =>
            {
                Err(Error::Msg(format!(
                    "{m}; or write the spine store (`deltafin convert-spine`): a budget below one layer maps its layers"
                )))
            }
            e => Err(e),
        }
    }

    /// The plan with `i`'s expert batch, reader buffers and layers in flight as they are, or
    /// with the streamed layers mapped (`mapped`: the largest tensor, charged instead).
    fn within(i: &PlanInputs, mapped: Option<u64>) -> std::result::Result<MemoryPlan, Refusal> {
        let (limit, source) = match i.limit_override {
            Some(b) => (b, "--memory-gb"),
            None => i.memory.limit(),
        };
        let reserve = i.reserve_override.unwrap_or_else(|| reserve(limit));
        let budget = limit.saturating_sub(reserve);
        let copies = if i.device_copies { 2 } else { 1 };
        let mut lines = fixed_lines(i, copies);
        let one = |ctx: usize| {
            i.state_fixed
                .saturating_add((ctx as u64).saturating_mul(i.state_per_position))
        };
        let state_at = |ctx: usize| (1 + i.saved_states as u64).saturating_mul(one(ctx));
        let context = choose_context(i, budget, &state_at)?;
        // The batch: the caller's, else the most sequences (up to 8) whose states at the
        // context fit a quarter of the budget.
        let max_batch = match i.batch {
            Some(b) => b.max(1),
            None => (1..=MAX_AUTO_BATCH)
                .rev()
                .find(|&b| (b as u64).saturating_mul(one(context)) <= budget / BATCH_SHARE)
                .unwrap_or(1),
        };
        let states = (max_batch + i.saved_states) as u64;
        lines.push((
            format!(
                "sequence states ({max_batch} in a batch{}) at {context} tokens",
                if i.saved_states > 0 {
                    format!(", +{} saved", i.saved_states)
                } else {
                    String::new()
                }
            ),
            states.saturating_mul(one(context)),
        ));
        // A cancelled prefill returns to the state before the turn: the KDA states are kept.
        lines.push((
            "state before the turn (KDA, for a cancel)".into(),
            i.state_fixed,
        ));
        let max_layer = i.layer_bytes.iter().copied().max().unwrap_or(0);
        let depth = i.in_flight.max(1) as u64;
        // The pass: the longest power of two (whole chunks, at most the context) within a tenth
        // of the budget that still leaves the model runnable with nothing pinned.
        let base = lines.iter().fold(0u64, |a, l| a.saturating_add(l.1));
        let streaming = mapped.unwrap_or(depth * max_layer * copies);
        let need = base.saturating_add(streaming);
        let prefill_pass = choose_pass(i, context, budget, need);
        lines.push((
            format!("prefill pass ({prefill_pass} positions, layer-major)"),
            (prefill_pass as u64).saturating_mul(i.pass_row_bytes),
        ));
        let fixed: u64 = lines.iter().fold(0u64, |a, l| a.saturating_add(l.1));
        let spine = if i.spine_resident {
            (
                "dense layers kept resident",
                copies * i.layer_bytes.iter().sum::<u64>(),
            )
        } else if mapped.is_some() {
            ("streamed layers mapped (the largest tensor)", streaming)
        } else {
            ("streamed layers in flight", streaming)
        };
        let floor = fixed.saturating_add(spine.1);
        if floor > budget {
            let mut big = lines.clone();
            big.push((spine.0.into(), spine.1));
            return Err(Refusal::Floor(too_small(
                big,
                floor,
                (budget, limit, reserve),
                source,
            )));
        }
        let spare = budget - floor;
        let (expert_ram, prefetch_cap) = tier_and_prefetch(i, spare)?;
        lines.push(("expert RAM tier".into(), expert_ram));
        lines.push(("prefetch holdings (cap)".into(), prefetch_cap));
        let left = budget - fixed - expert_ram - prefetch_cap;
        let (pinned, used, streamed_max) = if i.spine_resident {
            let n = i.layer_bytes.len();
            (vec![true; n], i.layer_bytes.iter().sum(), 0)
        } else if let Some(t) = mapped {
            let (p, used, max) = pin_layers(i, left.saturating_sub(t), 0, copies);
            (p, used, max.min(t))
        } else {
            pin_layers(i, left, depth, copies)
        };
        let count = pinned.iter().filter(|p| **p).count();
        lines.push((format!("pinned spine layers ({count})"), used * copies));
        lines.push(match mapped {
            Some(_) => (
                "streamed layers mapped (the largest tensor in the page cache)".into(),
                streamed_max,
            ),
            None => (
                format!("streamed layers in flight ({depth} × largest)"),
                depth * streamed_max * copies,
            ),
        });
        let lines: Vec<PlanLine> = lines
            .into_iter()
            .map(|(what, bytes)| PlanLine { what, bytes })
            .collect();
        let total = lines.iter().map(|l| l.bytes).sum();
        Ok(MemoryPlan {
            limit,
            limit_source: source.to_string(),
            reserve,
            lines,
            total,
            pinned,
            context,
            prefill_pass,
            expert_ram,
            prefetch_cap,
            prompt_cache: i.prompt_cache,
            max_batch,
            expert_batch: i.expert_batch,
            pool_buffers: i.pool_buffers,
            in_flight: i.in_flight.max(1),
            mapped_stream: mapped.is_some(),
        })
    }

    /// Layers pinned.
    pub fn pinned_count(&self) -> usize {
        self.pinned.iter().filter(|p| **p).count()
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "memory plan: limit {:.2} GB ({}), OS reserve {:.2} GB, budget {:.2} GB",
            gb(self.limit),
            self.limit_source,
            gb(self.reserve),
            gb(self.limit - self.reserve)
        )?;
        for l in &self.lines {
            writeln!(f, "  {:>9.3} GB  {}", gb(l.bytes), l.what)?;
        }
        write!(
            f,
            "  {:>9.3} GB  total charged; context limit {} tokens",
            gb(self.total),
            self.context
        )
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
