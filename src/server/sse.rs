//! The response side of a generation: the SSE stream (chunks, keep-alives, usage, `[DONE]`)
//! and, for non-streaming requests, collecting the whole reply. Knows nothing of requests or
//! the queue beyond the events it receives.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::logprobs::TokenLogprob;
use super::queue::Ev;
use super::validate::ApiError;
use crate::chat::Delta;

/// The `usage` object.
pub(super) fn usage(p: usize, c: usize, cached: usize) -> Value {
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": {"cached_tokens": cached}})
}

/// Builds one chunk: a delta (or, with `None`, the final chunk) and a finish reason.
pub(super) type ChunkFn = Arc<dyn Fn(Option<Delta>, Value) -> Value + Send + Sync>;
/// Builds the chunk that carries one token's log-probability.
pub(super) type LogprobFn = Arc<dyn Fn(&TokenLogprob) -> Value + Send + Sync>;

/// The SSE response for a generation: optional first chunk, one chunk per delta, the finish
/// chunk, the usage chunk when asked, `[DONE]`; comment keep-alives meanwhile.
pub(super) fn sse(
    rx: mpsc::UnboundedReceiver<Ev>,
    first: Option<Value>,
    (chunk, lp_chunk): (ChunkFn, LogprobFn),
    include_usage: bool,
    keepalive: u64,
) -> Response {
    let events = futures_util::stream::unfold((rx, first, false), move |(mut rx, first, done)| {
        let (chunk, lp_chunk) = (chunk.clone(), lp_chunk.clone());
        async move {
            if let Some(f) = first {
                return Some((
                    vec![Event::default().data(f.to_string())],
                    (rx, None, false),
                ));
            }
            if done {
                return None;
            }
            match rx.recv().await {
                Some(Ev::Delta(d)) => Some((
                    vec![Event::default().data(chunk(Some(d), Value::Null).to_string())],
                    (rx, None, false),
                )),
                Some(Ev::PromptLogprob(_)) => Some((Vec::new(), (rx, None, false))),
                Some(Ev::Logprob(l)) => Some((
                    vec![Event::default().data(lp_chunk(&l).to_string())],
                    (rx, None, false),
                )),
                Some(Ev::Done {
                    finish,
                    prompt,
                    completion,
                    cached,
                }) => {
                    let mut out =
                        vec![Event::default().data(chunk(None, json!(finish)).to_string())];
                    if include_usage {
                        let mut u = chunk(None, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage(prompt, completion, cached);
                        out.push(Event::default().data(u.to_string()));
                    }
                    out.push(Event::default().data("[DONE]"));
                    Some((out, (rx, None, true)))
                }
                Some(Ev::Failed(m)) => Some((
                    vec![
                        Event::default().data(
                            json!({"error": {"message": m, "type": "server_error"}}).to_string(),
                        ),
                        Event::default().data("[DONE]"),
                    ],
                    (rx, None, true),
                )),
                None => None,
            }
        }
    });
    let flat = futures_util::StreamExt::flat_map(events, |v| {
        futures_util::stream::iter(v.into_iter().map(Ok::<_, Infallible>))
    });
    Sse::new(flat)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(keepalive.max(1)))
                .text("keep-alive"),
        )
        .into_response()
}

/// A whole generation.
pub(super) struct Collected {
    pub content: String,
    pub reasoning: String,
    pub finish: &'static str,
    pub usage: Value,
    /// Each token's log-probability (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// The reply's tool calls.
    pub tool_calls: Vec<crate::chat::ToolCall>,
    /// The prompt's log-probabilities (`echo` with `logprobs`).
    pub prompt_logprobs: Vec<TokenLogprob>,
}

/// Collects a whole generation.
pub(super) async fn collect(mut rx: mpsc::UnboundedReceiver<Ev>) -> Result<Collected, ApiError> {
    let (mut content, mut reasoning, mut logprobs) = (String::new(), String::new(), Vec::new());
    let (mut tool_calls, mut prompt_logprobs) = (Vec::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Ev::Logprob(l) => logprobs.push(l),
            Ev::PromptLogprob(l) => prompt_logprobs.push(l),
            Ev::Delta(Delta::Content(t)) => content.push_str(&t),
            Ev::Delta(Delta::Reasoning(t)) => reasoning.push_str(&t),
            Ev::Delta(Delta::ToolCall(c)) => tool_calls.push(c),
            Ev::Done {
                finish,
                prompt,
                completion,
                cached,
            } => {
                return Ok(Collected {
                    content,
                    reasoning,
                    finish,
                    usage: usage(prompt, completion, cached),
                    logprobs,
                    tool_calls,
                    prompt_logprobs,
                })
            }
            Ev::Failed(m) => {
                return Err(ApiError {
                    status: 500,
                    message: m,
                    param: None,
                    kind: "server_error",
                    retry_secs: None,
                })
            }
        }
    }
    Err(ApiError {
        status: 500,
        message: "generation ended unexpectedly".into(),
        param: None,
        kind: "server_error",
        retry_secs: None,
    })
}
