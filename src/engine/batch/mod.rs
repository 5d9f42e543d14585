//! The batch scheduler: one thread that runs every active request through shared passes of
//! the model (`Model::run_batch`), so the spine is read once per pass for all of them and
//! each distinct selected expert once. Requests are admitted first come, first served, up to
//! `max_batch` at once, and wait in a bounded queue beyond that (`submit` refuses past it).
//! A new request's prompt is fed in pieces of at most `prefill_tokens` per pass beside the
//! decode rows of the others, so a long prompt does not stall their decoding for its whole
//! length; prompts run in admission order, so none starves. A cancelled request leaves at the
//! next pass. Each request's tokens and logits are bit-identical to running it alone
//! (`Engine::generate`): the passes are row-independent, the prompt cache resumes and saves at
//! the same cuts, and each request's chooser is called once per token, in order.
//!
//! Owns admission, the pass loop and per-request bookkeeping (`active`); must not touch model
//! internals.

mod active;

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

use crate::runtime::generate::{Drafter, GenerateOptions, Generation};
use crate::Engine;
use active::Active;

/// Scheduler settings.
#[derive(Debug, Clone, Copy)]
pub struct BatchOptions {
    /// Requests decoding (or prefilling) at once.
    pub max_batch: usize,
    /// Requests that may wait beyond `max_batch`.
    pub queue: usize,
    /// Most prompt tokens one pass feeds (beside the decode rows).
    pub prefill_tokens: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_batch: 4,
            queue: 16,
            prefill_tokens: 256,
        }
    }
}

/// What a request hears from the scheduler, in order: its tokens, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum SeqEvent {
    /// A generated token.
    Token(u32),
    /// Generation ended (`stop` says why; `Cancelled` after a cancel).
    Done(Generation),
    /// The request failed (the message says why).
    Failed(String),
}

/// Chooses a token from one row of logits.
pub type Chooser = Box<dyn FnMut(&[f32]) -> u32 + Send>;
/// Receives a request's events (on the scheduler's thread: keep it short).
pub type Listener = Box<dyn FnMut(SeqEvent) + Send>;
/// Receives each prompt position `p` (from 1) with the logits that predicted prompt token `p`.
pub type PromptLogits = Box<dyn FnMut(usize, &[f32]) + Send>;

/// One generation request.
pub struct Request {
    /// Prompt ids.
    pub ids: Vec<u32>,
    /// Positions where a later request may diverge (message ends), for the prompt cache.
    pub marks: Vec<usize>,
    /// Token limit, stop ids and speculation.
    pub opts: GenerateOptions,
    /// The request's token chooser (greedy, or its own seeded sampler).
    pub choose: Chooser,
    /// Its events.
    pub on_event: Listener,
    /// Set to stop it at the next pass.
    pub cancel: Arc<AtomicBool>,
    /// Proposes drafts when `opts.speculation` is on (`None`: the n-gram drafter). The
    /// output does not depend on it.
    pub drafter: Option<Box<dyn Drafter>>,
    /// Scores the prompt: every prompt row's logits go here (the prompt cache is not used,
    /// since it keeps no per-position logits), and `opts.max_new` may be 0.
    pub prompt_logits: Option<PromptLogits>,
}

/// Why `submit` refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Every batch place and queue place is taken.
    #[error("every batch place ({active} active) and queue place ({waiting} waiting) is taken")]
    Busy {
        /// Requests in the batch.
        active: usize,
        /// Requests waiting.
        waiting: usize,
    },
    /// The scheduler is shutting down.
    #[error("the scheduler is shutting down")]
    Closed,
}

/// What the scheduler has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct BatchStats {
    /// Requests in the batch now.
    pub active: usize,
    /// Requests waiting now.
    pub waiting: usize,
    /// Passes run.
    pub passes: u64,
    /// Decode rows fed (last tokens and drafts).
    pub decode_rows: u64,
    /// Prompt rows fed.
    pub prefill_rows: u64,
    /// Tokens emitted.
    pub emitted: u64,
    /// Sum over passes of the sequences in each (their mean is `seq_passes / passes`).
    pub seq_passes: u64,
    /// Seconds spent in passes.
    pub pass_secs: f64,
}

struct Queue {
    pending: VecDeque<Request>,
    stats: BatchStats,
    shutdown: bool,
}

struct Shared {
    q: Mutex<Queue>,
    cv: Condvar,
    opts: BatchOptions,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic on the scheduler thread poisons nothing the queue's counts cannot survive.
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The batch scheduler over an engine (one thread; dropped: stops after the current pass and
/// fails whatever was left).
pub struct Scheduler {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the scheduler's thread over `engine`.
    pub fn new(engine: Arc<Engine>, opts: BatchOptions) -> Scheduler {
        let opts = BatchOptions {
            max_batch: opts.max_batch.max(1),
            prefill_tokens: opts.prefill_tokens.max(1),
            ..opts
        };
        let shared = Arc::new(Shared {
            q: Mutex::new(Queue {
                pending: VecDeque::new(),
                stats: BatchStats::default(),
                shutdown: false,
            }),
            cv: Condvar::new(),
            opts,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("deltafin-batch".into())
            .spawn(move || run(engine, s))
            .ok();
        Scheduler { shared, thread }
    }

    /// The settings it runs with.
    pub fn options(&self) -> BatchOptions {
        self.shared.opts
    }

    /// Queues a request (it joins the batch when a place is free, first come, first served);
    /// refused when every batch and queue place is taken.
    pub fn submit(&self, req: Request) -> Result<(), SubmitError> {
        self.submit_all(vec![req])
    }

    /// Queues several requests at once (all or none), so they are admitted together when
    /// there is room: their prompts can then share the first pass.
    pub fn submit_all(&self, reqs: Vec<Request>) -> Result<(), SubmitError> {
        let mut q = self.shared.lock();
        if q.shutdown || self.thread.is_none() {
            return Err(SubmitError::Closed);
        }
        let (active, waiting) = (q.stats.active, q.pending.len());
        if active + waiting + reqs.len() > self.shared.opts.max_batch + self.shared.opts.queue {
            return Err(SubmitError::Busy { active, waiting });
        }
        q.pending.extend(reqs);
        q.stats.waiting = q.pending.len();
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Counts so far, and the batch and queue now.
    pub fn stats(&self) -> BatchStats {
        self.shared.lock().stats
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.cv.notify_all();
        if let Some(t) = self.thread.take() {
            // The last owner may be a request's listener on the scheduler thread itself (a
            // server whose state a finishing request held): that thread ends on its own.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// The scheduler thread: admit, run one pass, repeat; sleep when there is nothing to do.
fn run(engine: Arc<Engine>, shared: Arc<Shared>) {
    let opts = shared.opts;
    let mut active: Vec<Active> = Vec::new();
    loop {
        let fresh: Vec<Request> = {
            let mut q = shared.lock();
            while q.pending.is_empty() && active.is_empty() && !q.shutdown {
                q = shared.cv.wait(q).unwrap_or_else(|p| p.into_inner());
            }
            if q.shutdown {
                let left: Vec<Request> = q.pending.drain(..).collect();
                drop(q);
                for mut r in left {
                    (r.on_event)(SeqEvent::Failed("the server is shutting down".into()));
                }
                for a in active {
                    a.fail("the server is shutting down");
                }
                return;
            }
            let room = opts.max_batch.saturating_sub(active.len());
            let n = room.min(q.pending.len());
            let fresh = q.pending.drain(..n).collect();
            q.stats.waiting = q.pending.len();
            q.stats.active = active.len() + n;
            fresh
        };
        for r in fresh {
            if let Some(a) = Active::admit(&engine, r) {
                active.push(a);
            }
        }
        active.retain_mut(|a| !a.leave_if_cancelled(&engine));
        if !active.is_empty() {
            let step = active::step(&engine, &mut active, &opts);
            let mut q = shared.lock();
            let s = &mut q.stats;
            s.passes += 1;
            s.decode_rows += step.decode_rows as u64;
            s.prefill_rows += step.prefill_rows as u64;
            s.emitted += step.emitted as u64;
            s.seq_passes += step.seqs as u64;
            s.pass_secs += step.secs;
        }
        active.retain(|a| !a.is_done());
        shared.lock().stats.active = active.len();
    }
}
