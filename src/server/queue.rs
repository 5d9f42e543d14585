//! The server's one generation slot and its FIFO queue, and the generation itself on a
//! blocking thread: admission (429 when full), waiting that stops when the client leaves, and
//! cancellation at the next prefill chunk or token once the client is gone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::validate::{ApiError, Sampling};
use super::AppState;
use crate::chat::{ChatSplitter, Delta};
use crate::generate::sample::Sampler;
use crate::generate::StopReason;
use crate::tokenizer::StreamDecoder;
use crate::GenerateOptions;

/// A place in line: the slot now, or a reserved place in the queue.
pub(super) enum Ticket {
    Now(OwnedSemaphorePermit),
    Queued(Waiting),
}

/// Decrements the waiting count when a queued request leaves, however it leaves.
pub(super) struct Waiting(Arc<AppState>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Takes the slot or a queue place at once; 429 when the queue is full.
pub(super) fn reserve(st: &Arc<AppState>) -> Result<Ticket, ApiError> {
    if let Ok(p) = st.slot.clone().try_acquire_owned() {
        return Ok(Ticket::Now(p));
    }
    if st.waiting.fetch_add(1, Ordering::SeqCst) >= st.cfg.queue {
        st.waiting.fetch_sub(1, Ordering::SeqCst);
        return Err(ApiError {
            status: 429,
            message: "the server is busy and its queue is full; retry later".into(),
            param: None,
            kind: "rate_limit_error",
        });
    }
    Ok(Ticket::Queued(Waiting(st.clone())))
}

/// Waits in line (FIFO: tokio's semaphore is fair) for the slot.
async fn redeem(st: &AppState, t: Ticket) -> Result<OwnedSemaphorePermit, ApiError> {
    match t {
        Ticket::Now(p) => Ok(p),
        Ticket::Queued(_w) => st.slot.clone().acquire_owned().await.map_err(|_| ApiError {
            status: 503,
            message: "server shutting down".into(),
            param: None,
            kind: "server_error",
        }),
    }
}

/// Waits for the slot, then generates; events flow as soon as they exist, so a streaming
/// response (and its keep-alives) starts while the request is still queued. If the receiver
/// goes away, waiting stops or the generation is cancelled at the next token.
pub(super) fn start(
    st: Arc<AppState>,
    ticket: Ticket,
    (ids, marks): (Vec<u32>, Vec<usize>),
    max_new: usize,
    s: Sampling,
    chat: Option<bool>,
) -> mpsc::UnboundedReceiver<Ev> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let permit = tokio::select! {
            p = redeem(&st, ticket) => p,
            _ = tx.closed() => return,
        };
        let permit = match permit {
            Ok(p) => p,
            Err(e) => {
                let _ = tx.send(Ev::Failed(e.message));
                return;
            }
        };
        let cancel = Arc::new(AtomicBool::new(false));
        let mut inner = spawn_generation(st, permit, ids, marks, max_new, s, chat, cancel.clone());
        // The client leaving (the response dropped) cancels at once, even mid-prefill.
        loop {
            tokio::select! {
                ev = inner.recv() => match ev {
                    Some(ev) => {
                        if tx.send(ev).is_err() {
                            break;
                        }
                    }
                    None => return,
                },
                _ = tx.closed() => break,
            }
        }
        cancel.store(true, Ordering::SeqCst);
    });
    rx
}

pub(super) enum Ev {
    Delta(Delta),
    Done {
        finish: &'static str,
        prompt: usize,
        completion: usize,
        cached: usize,
    },
    Failed(String),
}

fn seed_of(s: &Sampling) -> u64 {
    s.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    })
}

/// Runs one generation on a blocking thread, sending deltas; stops when the receiver is gone.
#[allow(clippy::too_many_arguments)]
fn spawn_generation(
    st: Arc<AppState>,
    permit: OwnedSemaphorePermit,
    ids: Vec<u32>,
    marks: Vec<usize>,
    max_new: usize,
    s: Sampling,
    chat: Option<bool>,
    cancel: Arc<AtomicBool>,
) -> mpsc::UnboundedReceiver<Ev> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::task::spawn_blocking(move || {
        // Released before the final event goes out, so a client that sends its next request as
        // soon as this one completes finds the slot free (not a spurious 429).
        let mut permit = Some(permit);
        let mut sampler = Sampler::new(s.temperature, s.top_p, seed_of(&s));
        let mut dec = StreamDecoder::new();
        let mut split = ChatSplitter::new(chat.unwrap_or(false));
        let opts = GenerateOptions {
            max_new,
            stop_ids: vec![st.engine.eos()],
            speculation: st.cfg.speculation,
        };
        let send = |d: Vec<Delta>, cancel: &AtomicBool| {
            for x in d {
                if tx.send(Ev::Delta(x)).is_err() {
                    cancel.store(true, Ordering::SeqCst);
                }
            }
        };
        let res = st.engine.generate(
            &ids,
            &marks,
            &opts,
            &cancel,
            &mut |l: &[f32]| sampler.choose(l),
            |id| match chat {
                Some(_) => send(split.push_id(st.engine.tokenizer(), &mut dec, id), &cancel),
                None => send(
                    vec![Delta::Content(dec.push(st.engine.tokenizer(), id))],
                    &cancel,
                ),
            },
        );
        match res {
            Ok((g, _)) => {
                let rest = dec.finish();
                match chat {
                    Some(_) => {
                        let mut d = split.push(&rest);
                        d.extend(split.finish());
                        send(d, &cancel);
                    }
                    None => send(vec![Delta::Content(rest)], &cancel),
                }
                let finish = if g.stop == StopReason::Stop {
                    "stop"
                } else {
                    "length"
                };
                drop(permit.take());
                let _ = tx.send(Ev::Done {
                    finish,
                    prompt: ids.len(),
                    completion: g.generated_ids.len(),
                    cached: g.cached,
                });
            }
            Err(e) => {
                drop(permit.take());
                let _ = tx.send(Ev::Failed(e.to_string()));
            }
        }
    });
    rx
}
