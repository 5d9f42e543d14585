//! The memory plan's choices (`plan.rs` charges, these pick): the context limit, the prefill
//! pass, which spine layers to pin, and the refusal that names the largest charges. Pure
//! functions of `PlanInputs`; no state, no I/O.

use super::plan::PlanInputs;
use super::GB;
use crate::{Error, Result};

/// Share of the budget the sequence states may take when the plan picks the context.
const STATE_SHARE: u64 = 10;
/// Smallest context the plan picks on its own.
const MIN_AUTO_CONTEXT: usize = 4096;
/// Share of the budget a layer-major prefill pass may hold.
const PASS_SHARE: u64 = 10;
/// Longest pass the plan picks: a pass this long touches every expert of a K3 layer (1 −
/// (1 − 16/896)^4096 ≈ 1), so a longer one would read nothing less.
const MAX_PASS: usize = 4096;

/// Bytes as GB for messages.
pub(super) fn gb(b: u64) -> f64 {
    b as f64 / GB as f64
}

/// The context: the caller's (at most the model's window), else the longest power of two whose
/// sequence state fits `budget / STATE_SHARE`.
pub(super) fn choose_context(
    i: &PlanInputs,
    budget: u64,
    state_at: &dyn Fn(usize) -> u64,
) -> Result<usize> {
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
pub(super) fn choose_pass(i: &PlanInputs, context: usize, budget: u64, need: u64) -> usize {
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
pub(super) fn too_small(
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
pub(super) fn pin_layers(
    i: &PlanInputs,
    left: u64,
    depth: u64,
    copies: u64,
) -> (Vec<bool>, u64, u64) {
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
