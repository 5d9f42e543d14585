//! The `Model` behaviour every family whose per-layer state is a key/value row cache shares
//! (gpt-oss, Qwen3-MoE): a family implements `RowPass` (embed, one layer over a pass's rows,
//! logits, its limits) and gets the layer loop over one or several sequences, plan-sized
//! prefill passes with progress steps, a cancel flag honoured between layers (the state
//! rewound), verify passes with their row rollback, and batched passes in which each
//! sequence's rows are bit-identical to running it alone (every op computes a row the same way
//! whatever else is in the pass). Owns the loop and the mapping onto `Model`; the arithmetic is
//! the family's.

use std::sync::atomic::{AtomicBool, Ordering};

use candle::{Device, Tensor};

use crate::runtime::model::{check_batch, BatchItem, Forward, Logits, Output};
use crate::runtime::observe::{Both, Event, Observer, Observers, PrefillStep, Rows};
use crate::runtime::rollback::Rollback;
use crate::runtime::state::{LayerState, SeqState};
use crate::{Error, Result};

/// One sequence's part of a pass: its new ids and its state (advanced by the pass).
pub struct PassSeq<'a> {
    /// The positions fed.
    pub ids: &'a [u32],
    /// The sequence's state.
    pub state: &'a mut SeqState,
}

/// What a row-cache family provides; `run`, `run_batch` and `keep` below do the rest.
pub trait RowPass: Send + Sync {
    /// Width of a hidden row.
    fn hidden_size(&self) -> usize;
    /// Vocabulary size (the width of a logits row).
    fn vocab_size(&self) -> usize;
    /// Decoder layers.
    fn layer_count(&self) -> usize;
    /// Positions per prefill pass.
    fn pass_len(&self) -> usize;
    /// Expert bytes read from storage so far (for prefill progress).
    fn bytes_read(&self) -> u64;
    /// The model's own observers.
    fn observers(&self) -> &Observers;
    /// Refuses input the model cannot take (empty, out of vocabulary, past the context).
    fn check_input(&self, ids: &[u32], state: &SeqState) -> Result<()>;
    /// Embedding rows `[T, hidden]` of `ids`.
    fn embed(&self, ids: &[u32]) -> Result<Vec<f32>>;
    /// Layer `l` over the pass's rows `x` `[Σ T, hidden]` (in the order of `seqs`), in place.
    fn layer(
        &self,
        l: usize,
        x: &mut [f32],
        seqs: &mut [PassSeq<'_>],
        obs: &dyn Observer,
    ) -> Result<()>;
    /// `lm_head(norm(x))` for `t` rows → `[t, vocab]`.
    fn logits(&self, x: &[f32], t: usize) -> Result<Vec<f32>>;
}

/// The final hidden rows `[Σ T, hidden]` (each sequence's rows in order) after the last layer,
/// before the final norm, or `None` when `cancel` was set between layers (the states then hold
/// part of the pass: the caller rewinds them). With `prefill`, each layer is reported as a step.
pub fn hidden_seqs<M: RowPass + ?Sized>(
    m: &M,
    seqs: &mut [PassSeq<'_>],
    obs: &dyn Observer,
    cancel: Option<&AtomicBool>,
    prefill: Option<PrefillStep>,
) -> Result<Option<Vec<f32>>> {
    let layers = m.layer_count();
    for s in seqs.iter() {
        m.check_input(s.ids, s.state)?;
        if s.state.layers.len() != layers {
            return Err(Error::Msg(format!(
                "a state of {} layers for a model of {layers}",
                s.state.layers.len()
            )));
        }
    }
    let ids: Vec<u32> = seqs.iter().flat_map(|s| s.ids.iter().copied()).collect();
    let mut x = m.embed(&ids)?;
    let first_pos = seqs.first().map_or(0, |s| s.state.pos);
    obs.on(
        0,
        &Event::PassStart {
            first_pos,
            tokens: ids.len(),
        },
    );
    for l in 0..layers {
        if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Ok(None);
        }
        m.layer(l, &mut x, seqs, obs)?;
        let width = m.hidden_size();
        obs.on(l, &Event::LayerDone(Rows::Host { data: &x, width }));
        if let Some(step) = prefill {
            step.report(obs, l, m.bytes_read());
        }
    }
    for s in seqs.iter_mut() {
        s.state.pos += s.ids.len();
    }
    obs.on(layers, &Event::PassEnd);
    Ok(Some(x))
}

/// `hidden_seqs` for one sequence.
pub fn hidden<M: RowPass + ?Sized>(
    m: &M,
    ids: &[u32],
    state: &mut SeqState,
    obs: &dyn Observer,
    cancel: Option<&AtomicBool>,
    prefill: Option<PrefillStep>,
) -> Result<Option<Vec<f32>>> {
    hidden_seqs(m, &mut [PassSeq { ids, state }], obs, cancel, prefill)
}

/// One `run` pass: hidden rows of `ids`, or `None` when cancelled (state rewound); with
/// `step`, each layer is reported as a step of a prefill.
fn pass<M: RowPass + ?Sized>(
    m: &M,
    ids: &[u32],
    state: &mut SeqState,
    f: &Forward<'_>,
    step: Option<PrefillStep>,
) -> Result<Option<Vec<f32>>> {
    let mark = f.cancel.map(|_| state.mark());
    let out = match f.observer {
        Some(o) => hidden(m, ids, state, &Both(m.observers(), o), f.cancel, step)?,
        None => hidden(m, ids, state, m.observers(), f.cancel, step)?,
    };
    if out.is_none() {
        if let Some(mk) = mark {
            state.rewind(mk);
        }
    }
    Ok(out)
}

/// Logits as a Candle tensor: `[V]`, or `[rows, V]`.
fn tensor(vocab: usize, v: Vec<f32>, rows: Option<usize>) -> Result<Tensor> {
    Ok(match rows {
        None => Tensor::from_vec(v, vocab, &Device::Cpu)?,
        Some(t) => Tensor::from_vec(v, (t, vocab), &Device::Cpu)?,
    })
}

/// `Model::run` for a row-cache family: plan-sized passes (one pass with an undo record for a
/// verify pass: keeping a prefix truncates the key/value caches), cancellable between layers.
pub fn run<M: RowPass + ?Sized>(
    m: &M,
    ids: &[u32],
    state: &mut SeqState,
    f: &Forward<'_>,
) -> Result<Option<Output>> {
    m.check_input(ids, state)?;
    let (h, vocab) = (m.hidden_size(), m.vocab_size());
    if f.undo {
        let (pos, lens) = (state.pos, row_lens(state));
        let Some(x) = pass(m, ids, state, &Forward { cancel: None, ..*f }, None)? else {
            return Err(Error::Msg("verify was cancelled".into()));
        };
        let logits = tensor(vocab, m.logits(&x, ids.len())?, Some(ids.len()))?;
        return Ok(Some(Output {
            logits,
            rollback: Some(Rollback::row_caches(pos, ids.len(), lens)),
        }));
    }
    let mark = f.cancel.map(|_| state.mark());
    let (mut last, mut all) = (Vec::new(), Vec::new());
    let len = m.pass_len();
    let (passes, read_before) = (ids.len().div_ceil(len), m.bytes_read());
    for (p, piece) in ids.chunks(len).enumerate() {
        // A prefill reports each layer of each pass (progress bars, ETA).
        let step = (ids.len() > 1).then_some(PrefillStep {
            layer: 0,
            layers: m.layer_count(),
            pass: p,
            passes,
            pass_first: p * len,
            pass_tokens: piece.len(),
            positions: ids.len(),
            read_before,
            read_now: read_before,
        });
        let Some(x) = pass(m, piece, state, f, step)? else {
            if let Some(mk) = mark {
                state.rewind(mk);
            }
            return Ok(None);
        };
        match f.logits {
            Logits::All => all.extend(m.logits(&x, piece.len())?),
            Logits::Last => last = x,
        }
    }
    let logits = match f.logits {
        Logits::All => tensor(vocab, all, Some(ids.len()))?,
        Logits::Last => tensor(vocab, m.logits(&last[last.len() - h..], 1)?, None)?,
    };
    Ok(Some(Output {
        logits,
        rollback: None,
    }))
}

/// `Model::run_batch` for a row-cache family: one pass over the rows of every item; each
/// item's logits (`[V]` for `Logits::Last`, `[T, V]` otherwise) and, for an `undo` item, its
/// rollback. Not cancellable.
pub fn run_batch<M: RowPass + ?Sized>(
    m: &M,
    items: &mut [BatchItem<'_>],
    observer: Option<&dyn Observer>,
) -> Result<Vec<Output>> {
    check_batch(items, m.pass_len(), |i, s| m.check_input(i, s))?;
    // (position before, cache rows before, rows, whether only the last row is wanted).
    let shape: Vec<_> = items
        .iter()
        .map(|it| {
            let last = !it.undo && it.logits == Logits::Last;
            (it.state.pos, row_lens(it.state), it.ids.len(), last)
        })
        .collect();
    let mut seqs: Vec<PassSeq> = items
        .iter_mut()
        .map(|it| PassSeq {
            ids: it.ids,
            state: &mut *it.state,
        })
        .collect();
    let x = match observer {
        Some(o) => hidden_seqs(m, &mut seqs, &Both(m.observers(), o), None, None)?,
        None => hidden_seqs(m, &mut seqs, m.observers(), None, None)?,
    }
    .ok_or_else(|| Error::Msg("a batched pass was cancelled".into()))?;
    // The wanted rows of every item through one lm_head read.
    let h = m.hidden_size();
    let (mut wanted, mut at) = (Vec::new(), 0);
    for &(_, _, n, last) in &shape {
        let rows = &x[at * h..(at + n) * h];
        wanted.extend_from_slice(if last { &rows[(n - 1) * h..] } else { rows });
        at += n;
    }
    let vocab = m.vocab_size();
    let mut logits = m.logits(&wanted, wanted.len() / h)?.into_iter();
    let mut out = Vec::with_capacity(shape.len());
    for (it, (pos, lens, n, last)) in items.iter().zip(shape) {
        let take = if last { 1 } else { n };
        let l: Vec<f32> = logits.by_ref().take(take * vocab).collect();
        out.push(Output {
            logits: tensor(vocab, l, (!last).then_some(n))?,
            rollback: it.undo.then(|| Rollback::row_caches(pos, n, lens)),
        });
    }
    Ok(out)
}

/// `Model::keep` for a row-cache family: truncates the caches to the kept rows.
pub fn keep<M: RowPass + ?Sized>(
    m: &M,
    rb: Rollback,
    state: &mut SeqState,
    rows: usize,
) -> Result<()> {
    rb.keep(state, rows)?;
    m.observers().on(0, &Event::Kept { rows });
    Ok(())
}

/// Refuses empty input, ids past `vocab` and growth past `limit` positions (a state of
/// another model's layout is refused by the pass itself).
pub fn check_ids(ids: &[u32], state: &SeqState, vocab: usize, limit: usize) -> Result<()> {
    if ids.is_empty() {
        return Err(Error::Msg("no input ids".into()));
    }
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        return Err(Error::Msg(format!(
            "token id {bad} is outside the vocabulary ({vocab})"
        )));
    }
    let needed = state.pos + ids.len();
    if needed > limit {
        return Err(Error::ContextLimit { needed, limit });
    }
    Ok(())
}

/// An empty sequence: one key/value row cache per layer, of each row width in `widths`, for
/// up to `limit` positions.
pub fn new_state(widths: impl Iterator<Item = usize>, limit: usize) -> SeqState {
    SeqState {
        pos: 0,
        layers: widths
            .map(|w| LayerState::Rows(crate::runtime::row_cache::RowCache::new(w, limit)))
            .collect(),
    }
}

/// Each layer's cache length.
fn row_lens(state: &SeqState) -> Vec<usize> {
    state
        .layers
        .iter()
        .map(|l| match l {
            LayerState::Rows(c) => c.len(),
            _ => 0,
        })
        .collect()
}
