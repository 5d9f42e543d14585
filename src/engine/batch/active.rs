//! One request in the batch (`Active`): its state, where its prompt stands (resumed from the
//! prompt cache, then fed in pieces cut at the cache's cut points), its decoder, and the
//! events it sends; and `step`, one pass over the rows of every active request.
//!
//! Owns per-request bookkeeping; must not touch model internals or the queue.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{BatchOptions, Request, SeqEvent};
use crate::engine::prompt_cache::cut_points;
use crate::runtime::generate::{Drafter, Generation, Io, Pass, SeqDecoder, StopReason};
use crate::runtime::model::{BatchItem, Logits};
use crate::runtime::observers::{Part, PerSequence};
use crate::runtime::state::SeqState;
use crate::{Engine, Result};

enum Phase {
    /// Feeding the prompt: the next position and the cuts ahead (the prompt's end last).
    Prefill { at: usize, cuts: VecDeque<usize> },
    /// Decoding.
    Decode(Box<SeqDecoder>),
    /// Finished (its last event sent).
    Done,
}

/// One request in the batch.
pub(super) struct Active {
    req: Request,
    state: SeqState,
    phase: Phase,
    drafter: Box<dyn Drafter>,
    /// Prompt tokens the prompt cache supplied.
    cached: usize,
    /// Tokens emitted so far.
    tokens: usize,
    /// Whether the drafter has proposed yet (its first proposal reads the whole prompt, a
    /// cost of the prompt, not of the depth, so its time is not the pass's).
    drafted: bool,
    t0: Instant,
}

/// What one pass fed and emitted.
#[derive(Default)]
pub(super) struct Step {
    pub decode_rows: usize,
    pub prefill_rows: usize,
    pub emitted: usize,
    pub seqs: usize,
    pub secs: f64,
}

/// What one request feeds in a pass.
enum Rows {
    /// Prompt positions `at..at + n`.
    Prompt(usize, usize),
    /// The last token and its drafts.
    Decode(Vec<u32>, Vec<u32>),
}

/// The most prompt rows a scoring request (echo with logprobs) feeds in one pass: at K3's
/// 163,840-id vocabulary its logits are 256 x 163,840 x 4 B = 168 MB, held twice, instead of
/// growing with the pass (a 4,096-token pass would hold 5.4 GB).
const SCORING_ROWS: usize = 256;

impl Active {
    /// Takes a request into the batch: resumes it from the prompt cache (a whole-prompt hit
    /// starts decoding at once). `None` when it already ended (no tokens wanted, or failed:
    /// its event is sent).
    pub fn admit(engine: &Engine, mut req: Request) -> Option<Active> {
        let scoring = req.prompt_logits.is_some();
        if (req.opts.max_new == 0 && !scoring) || req.ids.is_empty() {
            let g = Generation::empty(&req.ids);
            (req.on_event)(SeqEvent::Done(g));
            return None;
        }
        let model = engine.model();
        // Checked here, not in the pass: one bad request must not fail the others' pass.
        let empty = SeqState {
            pos: 0,
            layers: Vec::new(),
        };
        if let Err(e) = model.check_input(&req.ids, &empty) {
            (req.on_event)(SeqEvent::Failed(e.to_string()));
            return None;
        }
        let t0 = Instant::now();
        let cache = engine.prompt_cache().filter(|_| !scoring);
        let (state, start, logits) = match cache.map(|c| c.lookup(&req.ids)) {
            Some(Ok(Some(r))) => (r.state, r.start, r.logits),
            Some(Err(e)) => {
                (req.on_event)(SeqEvent::Failed(e.to_string()));
                return None;
            }
            _ => (model.new_state(), 0, None),
        };
        let every = engine.prompt_cache().map_or(0, |c| c.every());
        let mut cuts: VecDeque<usize> = match engine.prompt_cache() {
            Some(_) => cut_points(req.ids.len(), &req.marks, every, start).into(),
            None => VecDeque::new(),
        };
        cuts.push_back(req.ids.len());
        let drafter = req.drafter.take().unwrap_or_else(|| engine.new_drafter());
        let mut a = Active {
            req,
            state,
            phase: Phase::Prefill { at: start, cuts },
            drafter,
            cached: start,
            tokens: 0,
            drafted: false,
            t0,
        };
        if let Some(l) = logits {
            a.start_decode(engine, l);
        }
        (!a.is_done()).then_some(a)
    }

    /// Whether its last event was sent.
    pub fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// Ends a cancelled request (its `Done` says `Cancelled`); returns whether it left.
    pub fn leave_if_cancelled(&mut self, engine: &Engine) -> bool {
        if !self.req.cancel.load(Ordering::Relaxed) {
            return false;
        }
        match std::mem::replace(&mut self.phase, Phase::Done) {
            Phase::Decode(mut d) => {
                d.cancel();
                self.phase = Phase::Decode(d);
                self.finish(engine);
            }
            _ => {
                let mut g = Generation::empty(&self.req.ids);
                g.stop = StopReason::Cancelled;
                g.cached = self.cached;
                (self.req.on_event)(SeqEvent::Done(g));
            }
        }
        true
    }

    /// Sends `Failed` and ends.
    pub fn fail(mut self, msg: &str) {
        (self.req.on_event)(SeqEvent::Failed(msg.to_string()));
        self.phase = Phase::Done;
    }

    /// The prompt's last logits are known: choose the first token and decode from here.
    fn start_decode(&mut self, engine: &Engine, logits: Vec<f32>) {
        let model = engine.model();
        let mut g = Generation::empty(&self.req.ids);
        g.prefill_ms = self.t0.elapsed().as_secs_f64() * 1e3;
        let d = Box::new(SeqDecoder::new(model, g, &logits, &self.req.opts));
        self.phase = Phase::Decode(d);
        self.absorb(engine, Pass::first(logits));
    }

    /// Emits from a decode pass's rows (or the prefill's last row); finishes when it ends.
    fn absorb(&mut self, engine: &Engine, pass: Pass) {
        let Phase::Decode(d) = &mut self.phase else {
            return;
        };
        let Request {
            choose,
            on_event,
            cancel,
            ..
        } = &mut self.req;
        let tokens = &mut self.tokens;
        let mut on_token = |id: u32| {
            *tokens += 1;
            on_event(SeqEvent::Token(id));
        };
        let io = Io {
            choose: &mut **choose,
            on_token: &mut on_token,
            cancel,
        };
        match d.absorb(
            engine.model(),
            &mut self.state,
            pass,
            &mut *self.drafter,
            io,
        ) {
            Ok(false) => {}
            Ok(true) => self.finish(engine),
            Err(e) => {
                (self.req.on_event)(SeqEvent::Failed(e.to_string()));
                self.phase = Phase::Done;
            }
        }
    }

    /// Sends `Done` with the generation, saving the state after the reply to the prompt cache
    /// as `Engine::generate` does.
    fn finish(&mut self, engine: &Engine) {
        let Phase::Decode(d) = std::mem::replace(&mut self.phase, Phase::Done) else {
            return;
        };
        let mut g = d.finish();
        g.cached = self.cached;
        if let Some(cache) = engine.prompt_cache() {
            let ids = &self.req.ids;
            let mut seq = ids.clone();
            seq.extend_from_slice(&g.generated_ids[..g.generated_ids.len().saturating_sub(1)]);
            let whole = self.state.pos == seq.len() && seq.len() > ids.len();
            if g.stop != StopReason::Cancelled && whole {
                if let Err(e) = cache.insert(&seq, &self.state, None) {
                    tracing::warn!("prompt cache: {e}");
                }
            }
        }
        (self.req.on_event)(SeqEvent::Done(g));
    }

    /// What this request feeds in the next pass, taking prompt positions from `budget`.
    fn rows(&mut self, budget: &mut usize) -> Option<Rows> {
        match &self.phase {
            Phase::Prefill { at, cuts } => {
                let to = cuts.front().copied().unwrap_or(self.req.ids.len());
                // A scoring piece holds `[n, vocab]` fp32 logits twice (the tensor and its rows).
                let cap = match self.req.prompt_logits {
                    Some(_) => SCORING_ROWS,
                    None => usize::MAX,
                };
                let n = (to - at).min(*budget).min(cap);
                *budget -= n;
                (n > 0).then_some(Rows::Prompt(*at, n))
            }
            Phase::Decode(d) => {
                let (ids, drafts) = d.next_ids(&self.state, &mut *self.drafter);
                Some(Rows::Decode(ids, drafts))
            }
            Phase::Done => None,
        }
    }

    /// Takes a prompt piece's pass: saves a cache entry at a cut; at the prompt's end, starts
    /// decoding from its logits.
    fn prompt_done(&mut self, engine: &Engine, n: usize, logits: candle::Tensor) -> Result<()> {
        let Phase::Prefill { at, cuts } = &mut self.phase else {
            return Ok(());
        };
        // Scoring: the piece's `[n, V]` rows, each predicting the next prompt token.
        let last = match self.req.prompt_logits.as_mut() {
            Some(score) => {
                let rows = logits.to_vec2::<f32>()?;
                for (r, row) in rows.iter().enumerate() {
                    if *at + r + 1 < self.req.ids.len() {
                        score(*at + r + 1, row);
                    }
                }
                rows.into_iter().last()
            }
            None => None,
        };
        *at += n;
        let at = *at;
        // A piece never runs past the next cut: reaching it is `at == front`.
        let reached = cuts.front() == Some(&at);
        if reached {
            cuts.pop_front();
        }
        let cache = engine.prompt_cache();
        // A cache that cannot save (a full disk) costs later requests a prefill, never this
        // one its answer.
        let save = |ids: &[u32], logits: Option<&[f32]>| {
            if let Some(c) = cache {
                if let Err(e) = c.insert(ids, &self.state, logits) {
                    tracing::warn!("prompt cache: {e}");
                }
            }
        };
        if at < self.req.ids.len() {
            if reached {
                save(&self.req.ids[..at], None);
            }
            return Ok(());
        }
        let logits = match last {
            Some(l) => l,
            None => logits.to_vec1::<f32>()?,
        };
        save(&self.req.ids, Some(&logits));
        tracing::debug!(
            "prefilled {} tokens ({} from the prompt cache) in {:.2} s",
            self.req.ids.len(),
            self.cached,
            self.t0.elapsed().as_secs_f64()
        );
        if self.req.opts.max_new == 0 {
            // A scoring request that wants no tokens ends with its prompt.
            let mut g = Generation::empty(&self.req.ids);
            g.prefill_ms = self.t0.elapsed().as_secs_f64() * 1e3;
            (self.req.on_event)(SeqEvent::Done(g));
            self.phase = Phase::Done;
            return Ok(());
        }
        self.start_decode(engine, logits);
        Ok(())
    }
}

/// One pass over every active request: the decode rows of each decoding request and prompt
/// pieces (in admission order, at most `prefill_tokens` positions in all, never past the next
/// cut), then each request takes its rows.
pub(super) fn step(engine: &Engine, active: &mut [Active], opts: &BatchOptions) -> Step {
    let model = engine.model();
    let most = model.pass_len();
    let mut st = Step::default();
    // Decode rows first, so the prompt pieces get what the pass has left.
    let mut plans: Vec<Option<Rows>> = Vec::with_capacity(active.len());
    // Each sequence's drafting time counts as its pass's, as in a solo generation: the depth
    // controller weighs both.
    let mut draft_secs = vec![0f64; active.len()];
    for (a, secs) in active.iter_mut().zip(&mut draft_secs) {
        let decoding = matches!(a.phase, Phase::Decode(_));
        let t = Instant::now();
        let plan = if decoding { a.rows(&mut 0) } else { None };
        if let Some(Rows::Decode(_, drafts)) = &plan {
            if !drafts.is_empty() && std::mem::replace(&mut a.drafted, true) {
                *secs = t.elapsed().as_secs_f64();
            }
        }
        plans.push(plan);
    }
    let decode_rows: usize = plans
        .iter()
        .map(|p| match p {
            Some(Rows::Decode(ids, _)) => ids.len(),
            _ => 0,
        })
        .sum();
    let mut budget = opts
        .prefill_tokens
        .min(most.saturating_sub(decode_rows).max(1));
    for (a, p) in active.iter_mut().zip(plans.iter_mut()) {
        if matches!(a.phase, Phase::Prefill { .. }) {
            *p = a.rows(&mut budget);
        }
    }
    let mut items = Vec::new();
    let mut owners = Vec::new();
    // Each sequence's drafter watches its own rows of the pass.
    let mut split = PerSequence { parts: Vec::new() };
    for (i, (a, p)) in active.iter_mut().zip(&plans).enumerate() {
        let (ids, undo) = match p {
            Some(Rows::Prompt(at, n)) => (&a.req.ids[*at..at + n], false),
            Some(Rows::Decode(ids, drafts)) => (&ids[..], !drafts.is_empty()),
            None => continue,
        };
        let scoring = a.req.prompt_logits.is_some() && matches!(p, Some(Rows::Prompt(..)));
        split.parts.push(Part {
            first_pos: a.state.pos,
            rows: ids.len(),
            observer: a.drafter.observer(),
        });
        items.push(BatchItem {
            ids,
            state: &mut a.state,
            logits: if scoring { Logits::All } else { Logits::Last },
            undo,
        });
        owners.push(i);
    }
    if items.is_empty() {
        return st;
    }
    st.seqs = items.len();
    let t = Instant::now();
    let observer = split
        .any()
        .then_some(&split as &dyn crate::runtime::observe::Observer);
    let res = model.run_batch(&mut items, observer);
    drop(items);
    drop(split);
    st.secs = t.elapsed().as_secs_f64();
    let outs = match res {
        Ok(o) => o,
        Err(e) => {
            for &i in &owners {
                let a = &mut active[i];
                (a.req.on_event)(SeqEvent::Failed(e.to_string()));
                a.phase = Phase::Done;
            }
            return st;
        }
    };
    for ((i, out), plan) in owners
        .into_iter()
        .zip(outs)
        .zip(plans.into_iter().flatten())
    {
        let a = &mut active[i];
        match plan {
            Rows::Prompt(_, n) => {
                let before = a.tokens;
                st.prefill_rows += n;
                if let Err(e) = a.prompt_done(engine, n, out.logits) {
                    (a.req.on_event)(SeqEvent::Failed(e.to_string()));
                    a.phase = Phase::Done;
                }
                st.emitted += a.tokens - before;
            }
            Rows::Decode(ids, drafts) => {
                st.decode_rows += ids.len();
                let before = a.tokens;

                match Pass::from_output(out, drafts, st.secs + draft_secs[i]) {
                    Ok(p) => a.absorb(engine, p),
                    Err(e) => {
                        (a.req.on_event)(SeqEvent::Failed(e.to_string()));
                        a.phase = Phase::Done;
                    }
                }
                st.emitted += a.tokens - before;
            }
        }
    }
    st
}
