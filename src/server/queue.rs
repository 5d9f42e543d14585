//! Admission and the hand-off to the batch scheduler: a place is reserved before the prompt is
//! tokenized (in arrival order through a fair semaphore, waiting up to the admission wait;
//! 429 with a `Retry-After` from the measured hold time when the waiting line is full), the request is submitted to the
//! engine's `Scheduler`, and its tokens come back as text deltas. A client that goes away
//! (its response dropped) cancels the request, which leaves the batch at the next pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc;

use super::logprobs::TokenLogprob;
use super::stop::StopMatcher;
use super::validate::{ApiError, Sampling};
use super::AppState;
use crate::chat::{Delta, JsonReply, Script, ToolForcer, Xtml};
use crate::engine::batch::{Request, SeqEvent};
use crate::runtime::generate::sample::Sampler;
use crate::runtime::generate::StopReason;
use crate::tokenizer::StreamDecoder;
use crate::GenerateOptions;

/// Log-probabilities the chooser records and the listener sends, one per token in order.
type Logprobs = Arc<std::sync::Mutex<std::collections::VecDeque<TokenLogprob>>>;

/// A reserved place (in the batch or its queue), given back when dropped.
pub(super) struct Place {
    _permit: tokio::sync::OwnedSemaphorePermit,
    st: Arc<AppState>,
    since: std::time::Instant,
}

impl Drop for Place {
    fn drop(&mut self) {
        // How long requests hold a place (a decaying average), for `Retry-After`.
        let ms = self.since.elapsed().as_millis() as u64;
        let held = &self.st.metrics.hold_ms;
        let old = held.load(Ordering::Relaxed);
        held.store(
            if old == 0 { ms } else { (old * 7 + ms) / 8 },
            Ordering::Relaxed,
        );
    }
}

/// 429 with the seconds a retry should wait: the requests ahead of it times the average time
/// one holds a place, over the places.
fn busy(st: &AppState, why: &str) -> ApiError {
    let ahead = st.waiting.load(Ordering::SeqCst) + st.max_batch + st.cfg.queue;
    let hold = st.metrics.hold_ms.load(Ordering::Relaxed).max(1000);
    let cap = (st.max_batch + st.cfg.queue) as u64;
    let secs = (ahead as u64 * hold)
        .div_ceil(cap.max(1) * 1000)
        .clamp(1, 600);
    ApiError {
        status: 429,
        message: format!("the server is busy: {why}; retry in about {secs} s"),
        param: None,
        kind: "rate_limit_error",
        retry_secs: None,
    }
    .retry_after(secs)
}

/// Takes a place: at once when one is free, else in arrival order (a request never loses its
/// turn to a later one) for up to the admission wait; 429 when the waiting line is full or the
/// wait ran out.
pub(super) async fn reserve(st: &Arc<AppState>) -> Result<Place, ApiError> {
    let place = |permit| Place {
        _permit: permit,
        st: st.clone(),
        since: std::time::Instant::now(),
    };
    if let Ok(p) = st.places.clone().try_acquire_owned() {
        st.metrics.admitted(0.0);
        return Ok(place(p));
    }
    if st.waiting.fetch_add(1, Ordering::SeqCst) >= st.cfg.wait_line {
        st.waiting.fetch_sub(1, Ordering::SeqCst);
        return Err(busy(st, "every batch, queue and waiting place is taken"));
    }
    let t = std::time::Instant::now();
    let got = tokio::time::timeout(st.cfg.admission_wait, st.places.clone().acquire_owned()).await;
    st.waiting.fetch_sub(1, Ordering::SeqCst);
    match got {
        Ok(Ok(p)) => {
            st.metrics.admitted(t.elapsed().as_secs_f64());
            Ok(place(p))
        }
        _ => Err(busy(
            st,
            &format!(
                "no place came free within {} s",
                st.cfg.admission_wait.as_secs()
            ),
        )),
    }
}

/// How a chat reply is read and kept: thinking on or off, its tools section returned as
/// calls or left as text, and the tokens `tool_choice` forces.
pub(super) struct ChatMode {
    pub thinking: bool,
    pub calls: bool,
    pub forcer: Option<ToolForcer>,
    /// `response_format` json_object.
    pub json: Option<JsonReply>,
}

/// A tool call's id: unique in this server's life, and across restarts by its start second.
fn call_id(st: &AppState) -> String {
    let n = st.next_id.fetch_add(1, Ordering::SeqCst);
    format!("call_{:x}_{n}", st.started)
}

/// An event for the response.
pub(super) enum Ev {
    Delta(Delta),
    /// A generated token's log-probability (sent before its text).
    Logprob(TokenLogprob),
    /// A prompt token's log-probability (`echo`), in order; the first one's is NaN (nothing
    /// predicts it).
    PromptLogprob(TokenLogprob),
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

/// Turns a request's token events into response events (on the scheduler's thread: token
/// decoding and the chat splitter are cheap). The place is given back before the final event
/// goes out, so a client that sends its next request as soon as this one completes finds it
/// free (not a spurious 429).
fn listener(
    st: Arc<AppState>,
    place: Place,
    tx: mpsc::UnboundedSender<Ev>,
    cancel: Arc<AtomicBool>,
    chat: Option<(bool, bool)>,
    ended: Arc<tokio::sync::Notify>,
    (stops, lps): (Vec<String>, Option<Logprobs>),
) -> impl FnMut(SeqEvent) + Send {
    let mut place = Some(place);
    let mut dec = StreamDecoder::new();
    let (thinking, calls) = chat.unwrap_or((false, false));
    // `handlers::chat` checked that the format's splitter builds before launching.
    let mut split = st
        .engine
        .chat_format()
        .splitter(st.engine.tokenizer_arc(), thinking, calls)
        .unwrap_or_else(|_| Xtml::reply(thinking, calls));
    let mut called = false;
    let mut stop = StopMatcher::new(stops);
    // Tokens up to the one that completed a stop sequence (the rest are dropped).
    let mut counted = 0usize;
    move |ev| {
        // Content passes through the stop matcher (reasoning does not); a match cancels the
        // request, which leaves the batch at the next pass.
        let mut send = |d: Vec<Delta>, stop: &mut StopMatcher| {
            for x in d {
                let x = match x {
                    Delta::Content(t) => Delta::Content(stop.push(&t)),
                    _ if stop.matched() => continue,
                    Delta::ToolCall(mut c) => {
                        c.id = call_id(&st);
                        called = true;
                        Delta::ToolCall(c)
                    }
                    r => r,
                };
                if matches!(&x, Delta::Content(t) if t.is_empty()) {
                    continue;
                }
                if tx.send(Ev::Delta(x)).is_err() {
                    cancel.store(true, Ordering::SeqCst);
                }
            }
            if stop.matched() {
                cancel.store(true, Ordering::SeqCst);
            }
        };
        let tok = st.engine.tokenizer();
        match ev {
            SeqEvent::Token(_) if stop.matched() => {}
            SeqEvent::Token(id) => {
                counted += 1;
                // The chooser recorded each token's log-probability, in order.
                if let Some(lp) = lps.as_ref().and_then(|q| q.lock().ok()?.pop_front()) {
                    let _ = tx.send(Ev::Logprob(lp));
                }
                match chat {
                    Some(_) => send(split.push_id(tok, &mut dec, id), &mut stop),
                    None => send(vec![Delta::Content(dec.push(tok, id))], &mut stop),
                }
            }
            SeqEvent::Done(g) => {
                let d = match chat {
                    Some(_) => split.finish(&mut dec),
                    None => vec![Delta::Content(dec.finish())],
                };
                send(d, &mut stop);
                let tail = stop.finish();
                if !tail.is_empty() {
                    let _ = tx.send(Ev::Delta(Delta::Content(tail)));
                }
                let finish = match (g.stop == StopReason::Stop, stop.matched(), called) {
                    (_, true, _) => "stop",
                    (true, _, true) => "tool_calls",
                    (true, _, false) => "stop",
                    _ => "length",
                };
                let completion = if stop.matched() {
                    counted
                } else {
                    g.generated_ids.len()
                };
                let m = &st.metrics;
                m.tokens_in
                    .fetch_add(g.prompt_ids.len() as u64, Ordering::Relaxed);
                m.tokens_cached
                    .fetch_add(g.cached as u64, Ordering::Relaxed);
                m.tokens_out.fetch_add(completion as u64, Ordering::Relaxed);
                drop(place.take());
                let _ = tx.send(Ev::Done {
                    finish,
                    prompt: g.prompt_ids.len(),
                    completion,
                    cached: g.cached,
                });
                ended.notify_one();
            }
            SeqEvent::Failed(m) => {
                drop(place.take());
                let _ = tx.send(Ev::Failed(m));
                ended.notify_one();
            }
        }
    }
}

/// Submits a request to the scheduler; events flow as soon as they exist, so a streaming
/// response (and its keep-alives) starts while the request still waits for a batch place.
/// When the receiver goes away, the request is cancelled.
pub(super) fn start(
    st: Arc<AppState>,
    place: Place,
    (ids, marks): (Vec<u32>, Vec<usize>),
    max_new: usize,
    s: Sampling,
    chat: Option<ChatMode>,
) -> mpsc::UnboundedReceiver<Ev> {
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(tokio::sync::Notify::new());
    // The client leaving (the response dropped) cancels at once, even while waiting.
    let (watch_tx, watch_cancel, watch_end) = (tx.clone(), cancel.clone(), ended.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = watch_tx.closed() => watch_cancel.store(true, Ordering::SeqCst),
            _ = watch_end.notified() => {}
        }
    });
    let mut sampler = Sampler::new(s.temperature, s.top_p, seed_of(&s));
    let stop = s.stop.clone();
    let lps: Option<Logprobs> = s.logprobs.map(|_| Default::default());
    let (record, top) = (lps.clone(), s.logprobs.unwrap_or(0));
    let tok_st = st.clone();
    // The test hook: a scripted reply (then the end of message) instead of the model's choice.
    let mut script = match &st.cfg.scripted_reply {
        Some(t) => {
            let mut ids = st.engine.tokenizer().encode(t, true);
            ids.push(st.engine.eos());
            Script::new(ids)
        }
        None => Script::default(),
    };
    let (mode, mut forcer, mut json) = match chat {
        Some(c) => (Some((c.thinking, c.calls)), c.forcer, c.json),
        None => (None, None, None),
    };
    if let Some(f) = forcer.as_mut() {
        f.bound(max_new, &st.engine.stop_ids());
    }
    let prompt_logits = (s.echo && s.logprobs.is_some()).then(|| {
        let (tx, ids) = (tx.clone(), ids.clone());
        let first = TokenLogprob {
            id: ids[0],
            logprob: f32::NAN,
            top: Vec::new(),
        };
        let _ = tx.send(Ev::PromptLogprob(first));
        Box::new(move |pos: usize, row: &[f32]| {
            let _ = tx.send(Ev::PromptLogprob(super::logprobs::of(row, ids[pos], top)));
        }) as crate::engine::batch::PromptLogits
    });
    let req = Request {
        ids,
        marks,
        opts: GenerateOptions {
            max_new,
            stop_ids: st.engine.stop_ids(),
            speculation: st.cfg.speculation,
        },
        choose: Box::new(move |l: &[f32]| {
            let tok = tok_st.engine.tokenizer();
            let mut chosen = false;
            let id = {
                let mut pick = |l: &[f32]| {
                    chosen = true;
                    script.pick().unwrap_or_else(|| sampler.choose(l))
                };
                match (forcer.as_mut(), json.as_mut()) {
                    (Some(f), _) => f.next(tok, || pick(l)),
                    (None, Some(j)) => j.next(tok, l, pick),
                    (None, None) => pick(l),
                }
            };
            script.saw(id, chosen);
            if let Some(Ok(mut q)) = record.as_ref().map(|q| q.lock()) {
                q.push_back(super::logprobs::of(l, id, top));
            }
            id
        }),
        on_event: Box::new(listener(
            st.clone(),
            place,
            tx.clone(),
            cancel.clone(),
            mode,
            ended,
            (stop, lps),
        )),
        cancel,
        drafter: None,
        prompt_logits,
    };
    if let Err(e) = st.scheduler.submit(req) {
        let _ = tx.send(Ev::Failed(e.to_string()));
    }
    rx
}
