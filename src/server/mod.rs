//! An OpenAI-compatible server (axum): `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions`, streaming or not. One generation runs at a time; a bounded FIFO queue
//! holds the next ones (429 with `Retry-After` when full). A place is reserved before the
//! prompt is tokenized, tokenizing runs off the async runtime, and a prompt over the context
//! limit gets 400. A client that goes away cancels its generation at the next prefill chunk or
//! token.

mod queue;
pub mod validate;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, Semaphore};

use crate::chat::{encode_segments, render, ChatOptions, Delta, Effort};
use crate::tokenizer::Tokenizer;
use crate::Engine;
use queue::{reserve, start, Ev};
use validate::{ApiError, Sampling};

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model id reported and accepted.
    pub model_id: String,
    /// Hard ceiling on new tokens per request.
    pub max_tokens: usize,
    /// Default new tokens for raw completions.
    pub completion_default: usize,
    /// Requests that may wait for the generation slot.
    pub queue: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Seconds between SSE comment keep-alives.
    pub keepalive_secs: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_id: "deltafin-kimi-k3".into(),
            max_tokens: 32768,
            completion_default: 256,
            queue: 0,
            body_limit: 16 << 20,
            keepalive_secs: 5,
        }
    }
}

/// Shared server state.
pub struct AppState {
    engine: Arc<Engine>,
    cfg: ServerConfig,
    slot: Arc<Semaphore>,
    waiting: AtomicUsize,
    next_id: AtomicUsize,
    /// The tokens consumed by the last chat generation and the state after them.
    last: std::sync::Mutex<Option<(Vec<u32>, crate::SeqState)>>,
}

impl AppState {
    /// State over an opened engine.
    pub fn new(engine: Engine, cfg: ServerConfig) -> Arc<Self> {
        Arc::new(AppState {
            engine: Arc::new(engine),
            cfg,
            slot: Arc::new(Semaphore::new(1)),
            waiting: AtomicUsize::new(0),
            next_id: AtomicUsize::new(1),
            last: std::sync::Mutex::new(None),
        })
    }
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.body_limit;
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(|| async {
            error(ApiError {
                status: 404,
                message: "unknown route".into(),
                param: None,
                kind: "not_found_error",
            })
        })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Serves on `listener` until the process stops.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    axum::serve(listener, router(state)).await
}

fn error(e: ApiError) -> Response {
    let mut r = (
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        Json(e.body()),
    )
        .into_response();
    if e.status == 429 {
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    r
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [{"id": st.cfg.model_id, "object": "model", "created": 0, "owned_by": "deltafin"}]})).into_response()
}

fn check_model(body: &[u8], st: &AppState) -> Result<(), ApiError> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match v.get("model").and_then(|m| m.as_str()) {
        Some(m) if m != st.cfg.model_id => Err(ApiError {
            status: 404,
            message: format!(
                "model `{m}` does not exist (this server serves `{}`)",
                st.cfg.model_id
            ),
            param: Some("model".into()),
            kind: "invalid_request_error",
        }),
        _ => Ok(()),
    }
}

fn usage(p: usize, c: usize, cached: usize) -> Value {
    json!({"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": {"cached_tokens": cached}})
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Builds one chunk: a delta (or, with `None`, the final chunk) and a finish reason.
type ChunkFn = Arc<dyn Fn(Option<Delta>, Value) -> Value + Send + Sync>;

/// The SSE response for a generation: optional first chunk, one chunk per delta, the finish
/// chunk, the usage chunk when asked, `[DONE]`; comment keep-alives meanwhile.
fn sse(
    rx: mpsc::UnboundedReceiver<Ev>,
    first: Option<Value>,
    chunk: ChunkFn,
    include_usage: bool,
    keepalive: u64,
) -> Response {
    let events = futures_util::stream::unfold((rx, first, false), move |(mut rx, first, done)| {
        let chunk = chunk.clone();
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

/// Collects a whole generation: `(content, reasoning, finish, prompt tokens, completion tokens)`.
async fn collect(
    mut rx: mpsc::UnboundedReceiver<Ev>,
) -> Result<(String, String, &'static str, Value), ApiError> {
    let (mut content, mut reasoning) = (String::new(), String::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Ev::Delta(Delta::Content(t)) => content.push_str(&t),
            Ev::Delta(Delta::Reasoning(t)) => reasoning.push_str(&t),
            Ev::Done {
                finish,
                prompt,
                completion,
                cached,
            } => {
                return Ok((
                    content,
                    reasoning,
                    finish,
                    usage(prompt, completion, cached),
                ))
            }
            Ev::Failed(m) => {
                return Err(ApiError {
                    status: 500,
                    message: m,
                    param: None,
                    kind: "server_error",
                })
            }
        }
    }
    Err(ApiError {
        status: 500,
        message: "generation ended unexpectedly".into(),
        param: None,
        kind: "server_error",
    })
}

/// A request that got a slot or a queue place, with what its response needs.
struct Launched {
    rx: mpsc::UnboundedReceiver<Ev>,
    id: String,
    model: String,
    created: u64,
    stream: bool,
    include_usage: bool,
}

/// Turns a request into prompt ids (run on a blocking thread).
type Tokenize = Box<dyn FnOnce(&Tokenizer) -> Vec<u32> + Send>;

/// Reserves a place (429 when the queue is full), tokenizes on a blocking thread, checks the
/// context limit (400 naming it) and starts the generation.
async fn launch(
    st: &Arc<AppState>,
    prefix: &str,
    (param, tokenize): (&str, Tokenize),
    default_max: usize,
    s: Sampling,
    chat: Option<bool>,
) -> Result<Launched, ApiError> {
    // The request's max_tokens (else the endpoint's default), never above the server ceiling.
    let max_new = s.max_tokens.unwrap_or(default_max).min(st.cfg.max_tokens);
    let ticket = reserve(st)?;
    let engine = st.engine.clone();
    // The place is held by the tokenizing thread itself: a client that leaves cannot free it
    // while its prompt is still being tokenized.
    let (ids, ticket) = tokio::task::spawn_blocking(move || (tokenize(engine.tokenizer()), ticket))
        .await
        .map_err(|e| ApiError {
            status: 500,
            message: format!("tokenizing failed: {e}"),
            param: None,
            kind: "server_error",
        })?;
    let limit = st.engine.model().context_limit();
    if ids.len() >= limit {
        return Err(ApiError::bad(
            param,
            format!(
                "the prompt is {} tokens; this server's context limit is {limit} tokens (prompt and reply together)",
                ids.len()
            ),
        ));
    }
    let (stream, include_usage) = (s.stream, s.include_usage);
    Ok(Launched {
        rx: start(st.clone(), ticket, ids, max_new, s, chat),
        id: format!("{prefix}-{}", st.next_id.fetch_add(1, Ordering::SeqCst)),
        model: st.cfg.model_id.clone(),
        created: now(),
        stream,
        include_usage,
    })
}

async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match validate::chat(&body).and_then(|r| check_model(&body, &st).map(|_| r)) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let effort = if req.thinking {
        match Effort::resolve(req.effort.as_deref()) {
            Ok(e) => Some(e),
            Err(e) => return error(ApiError::bad("reasoning_effort", e.to_string())),
        }
    } else {
        None
    };
    let segs = match render(
        &req.messages,
        &ChatOptions {
            thinking: req.thinking,
            effort,
            tools: None,
        },
    ) {
        Ok(s) => s,
        Err(e) => return error(ApiError::bad("messages", e.to_string())),
    };
    let tokenize = Box::new(move |t: &Tokenizer| encode_segments(t, &segs));
    let Launched {
        rx,
        id,
        model,
        created,
        stream,
        include_usage,
    } = match launch(
        &st,
        "chatcmpl",
        ("messages", tokenize),
        st.cfg.max_tokens,
        req.sampling,
        Some(req.thinking),
    )
    .await
    {
        Ok(l) => l,
        Err(e) => return error(e),
    };
    if !stream {
        return match collect(rx).await {
            Ok((content, reasoning, finish, u)) => {
                let mut msg = json!({"role": "assistant", "content": content});
                if req.thinking {
                    msg["reasoning_content"] = json!(reasoning);
                }
                Json(json!({"id": id, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": u}))
                .into_response()
            }
            Err(e) => error(e),
        };
    }
    let first = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": Value::Null}]});
    let chunk: ChunkFn = Arc::new(move |d: Option<Delta>, finish: Value| {
        let delta = match d {
            Some(Delta::Content(t)) => json!({"content": t}),
            Some(Delta::Reasoning(t)) => json!({"reasoning_content": t}),
            None => json!({}),
        };
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    });
    sse(rx, Some(first), chunk, include_usage, st.cfg.keepalive_secs)
}

async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match validate::completion(&body).and_then(|r| check_model(&body, &st).map(|_| r)) {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let prompt = req.prompt.clone();
    let tokenize = Box::new(move |t: &Tokenizer| t.encode_ordinary(&prompt));
    let Launched {
        rx,
        id,
        model,
        created,
        stream,
        include_usage,
    } = match launch(
        &st,
        "cmpl",
        ("prompt", tokenize),
        st.cfg.completion_default,
        req.sampling,
        None,
    )
    .await
    {
        Ok(l) => l,
        Err(e) => return error(e),
    };
    if !stream {
        return match collect(rx).await {
            Ok((text, _, finish, u)) => Json(json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": Value::Null}], "usage": u}))
            .into_response(),
            Err(e) => error(e),
        };
    }
    let chunk: ChunkFn = Arc::new(move |d: Option<Delta>, finish: Value| {
        let text = match d {
            Some(Delta::Content(t)) | Some(Delta::Reasoning(t)) => t,
            None => String::new(),
        };
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": Value::Null}]})
    });
    sse(rx, None, chunk, include_usage, st.cfg.keepalive_secs)
}
