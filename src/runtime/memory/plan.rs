//! `MemoryPlan`: one budget, computed once at startup, that charges every consumer before any
//! layer is pinned: the process baseline, small tensors, lm_head and the tail, pinned layers
//! (twice with a device copy), streamed layers in flight, the expert RAM tier, prefetch holdings,
//! expert reads in flight, the reader pool's idle buffers, per-sequence state at the chosen
//! context (and the server's saved states), prefill activations, and the OS reserve. Pure
//! arithmetic over `PlanInputs`, so every rule is unit-tested.

use super::{reserve, Memory, GB};
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

/// Share of the budget the sequence states may take when the plan picks the context.
const STATE_SHARE: u64 = 10;
/// Smallest context the plan picks on its own.
const MIN_AUTO_CONTEXT: usize = 4096;
/// Share of the budget a layer-major prefill pass may hold.
const PASS_SHARE: u64 = 10;
/// Longest pass the plan picks: a pass this long touches every expert of a K3 layer (1 −
/// (1 − 16/896)^4096 ≈ 1), so a longer one would read nothing less.
const MAX_PASS: usize = 4096;
/// Experts the prefetch may hold at most (four layers' worth of a K3 token).
const PREFETCH_EXPERTS: u64 = 64;

fn gb(b: u64) -> f64 {
    b as f64 / GB as f64
}

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

/// The expert RAM tier: `--ram-gb` when it fits in `spare`, else a fifth of `spare` (at most
/// 4 GiB; the rest pins layers).
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
        // A tight budget holds fewer expert reads at once before the model is refused.
        let mut j = i.clone();
        loop {
            match Self::within(&j) {
                Ok(p) => return Ok(p),
                Err(Refusal::Floor(_)) if j.expert_batch > 1 || j.pool_buffers > 1 => {
                    j.expert_batch = (j.expert_batch / 2).max(1);
                    j.pool_buffers = (j.pool_buffers / 2).max(1);
                }
                Err(Refusal::Floor(e) | Refusal::Other(e)) => return Err(e),
            }
        }
    }

    /// The plan with `i`'s expert batch and reader buffers as they are.
    fn within(i: &PlanInputs) -> std::result::Result<MemoryPlan, Refusal> {
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
        let need = base.saturating_add(depth * max_layer * copies);
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
        } else {
            ("streamed layers in flight", depth * max_layer * copies)
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
        let expert_ram = expert_tier(i.expert_ram, spare)?;
        let prefetch_cap = match (PREFETCH_EXPERTS * i.expert_bytes).min((spare - expert_ram) / 10)
        {
            // A cap below one expert could never start a read: prefetch is off.
            c if i.prefetch && c >= i.expert_bytes => c,
            _ => 0,
        };
        lines.push(("expert RAM tier".into(), expert_ram));
        lines.push(("prefetch holdings (cap)".into(), prefetch_cap));
        let left = budget - fixed - expert_ram - prefetch_cap;
        let (pinned, used, streamed_max) = if i.spine_resident {
            let n = i.layer_bytes.len();
            (vec![true; n], i.layer_bytes.iter().sum(), 0)
        } else {
            pin_layers(i, left, depth, copies)
        };
        let count = pinned.iter().filter(|p| **p).count();
        lines.push((format!("pinned spine layers ({count})"), used * copies));
        lines.push((
            format!("streamed layers in flight ({depth} × largest)"),
            depth * streamed_max * copies,
        ));
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

/// The context: the caller's (at most the model's window), else the longest power of two whose
/// sequence state fits `budget / STATE_SHARE`.
fn choose_context(i: &PlanInputs, budget: u64, state_at: &dyn Fn(usize) -> u64) -> Result<usize> {
    match i.context {
        Some(c) if c > i.max_context => Err(Error::Msg(format!(
            "--context {c} is over the model's max_position_embeddings ({})",
            i.max_context
        ))),
        Some(c) => Ok(c.max(1)),
        None => {
            let share = budget / STATE_SHARE;
            let mut c = MIN_AUTO_CONTEXT.min(i.max_context).max(1);
            // Bounded: 2^30 positions is far past any model's window.
            while c <= i.max_context / 2 && c < 1 << 30 && state_at(c * 2) <= share {
                c *= 2;
            }
            Ok(c)
        }
    }
}

/// The prefill pass: the longest power of two of whole chunks (at most the context and
/// `MAX_PASS`) within `budget / PASS_SHARE` that still leaves the model runnable with nothing
/// pinned (`need`: every other fixed cost plus the streamed layers in flight).
fn choose_pass(i: &PlanInputs, context: usize, budget: u64, need: u64) -> usize {
    let pass_bytes = |p: usize| (p as u64).saturating_mul(i.pass_row_bytes);
    let chunk = i.prefill_chunk.max(1);
    let mut pass = chunk;
    while pass * 2 <= MAX_PASS.min(context.max(chunk))
        && pass_bytes(pass * 2) <= budget / PASS_SHARE
        && need.saturating_add(pass_bytes(pass * 2)) <= budget
    {
        pass *= 2;
    }
    pass
}

/// The error for a budget below the model's floor, naming the three largest costs.
fn too_small(
    mut big: Vec<(String, u64)>,
    floor: u64,
    (budget, limit, reserve): (u64, u64, u64),
    source: &str,
) -> Error {
    big.sort_by_key(|l| std::cmp::Reverse(l.1));
    let top: Vec<String> = big
        .iter()
        .take(3)
        .map(|(w, b)| format!("{w} {:.2} GB", gb(*b)))
        .collect();
    Error::Msg(format!(
        "the model needs at least {:.2} GB, but the memory budget is {:.2} GB ({:.2} GB {source} − {:.2} GB reserve); largest: {}. Lower --context, or raise --memory-gb if this machine has more",
        gb(floor),
        gb(budget),
        gb(limit),
        gb(reserve),
        top.join(", ")
    ))
}

/// Pins whole layers in order while the pinned bytes plus the in-flight template buffers (sized
/// for the largest layer still streamed) fit `left`: which are pinned, their bytes, and the
/// largest streamed layer.
fn pin_layers(i: &PlanInputs, left: u64, depth: u64, copies: u64) -> (Vec<bool>, u64, u64) {
    let cap = i.resident_cap.unwrap_or(u64::MAX);
    let n = i.layer_bytes.len();
    let mut pinned = vec![false; n];
    let mut used = 0u64;
    for l in 0..n {
        let b = i.layer_bytes[l];
        let rest_max = (0..n)
            .filter(|&k| k != l && !pinned[k])
            .map(|k| i.layer_bytes[k])
            .max()
            .unwrap_or(0);
        // On Metal a streamed layer also has a device template: in flight costs `copies` too,
        // and `--spine-resident-gb` counts both copies of a pinned layer.
        let total = (used + b) * copies;
        if total <= cap && total + depth * rest_max * copies <= left {
            pinned[l] = true;
            used += b;
        }
    }
    let streamed_max = (0..n)
        .filter(|&k| !pinned[k])
        .map(|k| i.layer_bytes[k])
        .max()
        .unwrap_or(0);
    (pinned, used, streamed_max)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
