//! The HTTP handlers: `/v1/models`, `/v1/chat/completions` and `/v1/completions`. Each
//! validates its body, reserves a place in the queue, tokenizes off the runtime, checks the
//! context limit and answers through `sse` (streaming) or `collect`. No generation code here.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::completion_request;
use super::logprobs::{self, TokenLogprob};
use super::queue::{reserve, start, ChatMode, Ev};
use super::sse::{collect, sse, ChunkFn, LogprobFn};
use super::validate::{self, ApiError, JsonFormat, Sampling};
use super::{error, tools, AppState};
use crate::chat::{encode_marked, token_table, Delta, JsonMask, JsonReply, ToolChoice, ToolForcer};
use crate::tokenizer::Tokenizer;

/// `/v1/models`.
pub(super) async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [model_card(&st)]})).into_response()
}

fn model_card(st: &AppState) -> Value {
    json!({"id": st.model_id(), "object": "model", "created": 0, "owned_by": "deltafin"})
}

/// `GET /v1/models/{id}` (the official client's `models.retrieve`): the model, or 404.
pub(super) async fn model(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    if id == st.model_id() {
        return Json(model_card(&st)).into_response();
    }
    super::error(ApiError {
        status: 404,
        message: format!(
            "model `{id}` does not exist (this server serves `{}`)",
            st.model_id()
        ),
        param: Some("model".into()),
        kind: "invalid_request_error",
        retry_secs: None,
    })
}

/// A request naming another model gets 404; a `model` that is not a string, 400.
fn check_model(body: &[u8], st: &AppState) -> Result<(), ApiError> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match v.get("model") {
        Some(m) if !m.is_string() && !m.is_null() => {
            return Err(ApiError {
                status: 400,
                message: format!("`model` must be a string, not {m}"),
                param: Some("model".into()),
                kind: "invalid_request_error",
                retry_secs: None,
            })
        }
        _ => {}
    }
    match v.get("model").and_then(|m| m.as_str()) {
        Some(m) if m != st.model_id() => Err(ApiError {
            status: 404,
            message: format!(
                "model `{m}` does not exist (this server serves `{}`)",
                st.model_id()
            ),
            param: Some("model".into()),
            kind: "invalid_request_error",
            retry_secs: None,
        }),
        _ => Ok(()),
    }
}

/// Seconds since the epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

/// Validates a request body and its model off the async runtime: a body of megabytes takes
/// milliseconds to parse, and `/v1/models` must keep answering meanwhile.
async fn parse<T: Send + 'static>(
    st: &Arc<AppState>,
    body: Bytes,
    check: fn(&[u8]) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || {
        check(&body).and_then(|r| check_model(&body, &st).map(|_| r))
    })
    .await
    .map_err(|e| ApiError {
        status: 500,
        message: format!("request validation failed: {e}"),
        param: None,
        kind: "server_error",
        retry_secs: None,
    })?
}

/// Turns a request into prompt ids (run on a blocking thread).
type Tokenize = Box<dyn FnOnce(&Tokenizer) -> (Vec<u32>, Vec<usize>) + Send>;

/// Reserves a place (429 when the queue is full), tokenizes on a blocking thread, checks the
/// context limit (400 naming it) and starts the generation.
async fn launch(
    st: &Arc<AppState>,
    prefix: &str,
    (param, tokenize): (&str, Tokenize),
    default_max: usize,
    s: Sampling,
    chat: Option<ChatMode>,
) -> Result<Launched, ApiError> {
    // The request's max_tokens (else the endpoint's default), never above the server ceiling.
    let max_new = s.max_tokens.unwrap_or(default_max).min(st.cfg.max_tokens);
    let place = reserve(st).await?;
    let engine = st.engine.clone();
    // The place is held by the tokenizing thread itself: a client that leaves cannot free it
    // while its prompt is still being tokenized.
    let ((ids, marks), place) =
        tokio::task::spawn_blocking(move || (tokenize(engine.tokenizer()), place))
            .await
            .map_err(|e| ApiError {
                status: 500,
                message: format!("tokenizing failed: {e}"),
                param: None,
                kind: "server_error",
                retry_secs: None,
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
    // A reply that cannot fit is refused, as OpenAI and llama.cpp do, not cut short.
    if let Some(n) = s
        .max_tokens
        .filter(|&n| ids.len().saturating_add(n) > limit)
    {
        let k = s.max_tokens_param;
        return Err(ApiError::bad(
            k,
            format!(
                "`{k}` {n} and the prompt's {} tokens exceed this server's context limit of \
                 {limit} tokens",
                ids.len()
            ),
        ));
    }
    let (stream, include_usage) = (s.stream, s.include_usage);
    Ok(Launched {
        rx: start(st.clone(), place, (ids, marks), max_new, s, chat),
        id: format!("{prefix}-{}", st.next_id.fetch_add(1, Ordering::SeqCst)),
        model: st.model_id().to_string(),
        created: now(),
        stream,
        include_usage,
    })
}

/// `/v1/chat/completions`.
pub(super) async fn chat(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match parse(&st, body, validate::chat).await {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let format = st.engine.chat_format();
    let opts = match super::prompt::chat_options(
        &req,
        format,
        st.cfg.default_effort.as_deref(),
        st.cfg.date.clone(),
    ) {
        Ok(o) => o,
        Err(e) => return error(e),
    };
    // Every format renders tools and parses calls; forcing a call and the JSON masks need a
    // format that steers replies.
    let forced = matches!(
        req.tools.choice,
        ToolChoice::Required | ToolChoice::Function(_)
    );
    if !format.steers_replies() && (req.json.is_some() || (req.tools.tools.is_some() && forced)) {
        return error(ApiError::bad(
            if req.json.is_some() {
                "response_format"
            } else {
                "tool_choice"
            },
            format!(
                "this model's chat format ({}) supports tool_choice auto and none, and no response_format yet",
                format.name()
            ),
        ));
    }
    // The splitter the reply will need (harmony's specials must be in the vocabulary).
    if let Err(e) = format.splitter(st.engine.tokenizer_arc(), false, false) {
        return error(ApiError {
            status: 500,
            message: e.to_string(),
            param: None,
            kind: "server_error",
            retry_secs: None,
        });
    }
    let (segs, seg_marks) = match format.render(&req.messages, &opts) {
        Ok(s) => s,
        Err(e) => return error(ApiError::bad("messages", e.to_string())),
    };
    let tokenize = Box::new(move |t: &Tokenizer| encode_marked(t, &segs, &seg_marks));
    let want_lp = req.sampling.logprobs.is_some();
    let t = &req.tools;
    let mode = ChatMode {
        thinking: req.thinking,
        calls: t.calls_on(),
        forcer: t
            .tools
            .as_ref()
            .filter(|_| format.steers_replies())
            .and_then(|_| {
                ToolForcer::new(st.engine.tokenizer(), &t.choice, t.parallel, req.thinking)
            }),
        json: req.json.as_ref().and_then(|f| {
            let tok = st.engine.tokenizer();
            let vocab = st.engine.model().vocab_size();
            let table = st
                .json_tokens
                .get_or_init(|| token_table(tok, vocab))
                .clone();
            let mask = match f {
                JsonFormat::Object => JsonMask::new(table),
                JsonFormat::Schema(s, _) => JsonMask::with_schema(table, s.clone()),
            };
            JsonReply::new(tok, mask, req.thinking)
        }),
    };
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
        Some(mode),
    )
    .await
    {
        Ok(l) => l,
        Err(e) => return error(e),
    };
    if !stream {
        return match collect(rx).await {
            Ok(c) => {
                let mut msg = json!({"role": "assistant", "content": c.content});
                if req.thinking {
                    msg["reasoning_content"] = json!(c.reasoning);
                }
                if !c.tool_calls.is_empty() {
                    let calls: Vec<Value> = c
                        .tool_calls
                        .iter()
                        .map(|x| tools::call_json(x, None))
                        .collect();
                    msg["tool_calls"] = json!(calls);
                    if c.content.is_empty() {
                        msg["content"] = Value::Null;
                    }
                }
                let lp = want_lp.then(|| logprobs::chat_json(st.engine.tokenizer(), &c.logprobs));
                Json(json!({"id": id, "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": msg, "logprobs": lp, "finish_reason": c.finish}], "usage": c.usage}))
                .into_response()
            }
            Err(e) => error(e),
        };
    }
    let (id_lp, model_lp) = (id.clone(), model.clone());
    let first = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": Value::Null}]});
    // Streamed calls are numbered in the order they arrive.
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let chunk: ChunkFn = Arc::new(move |d: Option<Delta>, finish: Value| {
        let delta = match d {
            Some(Delta::Content(t)) => json!({"content": t}),
            Some(Delta::Reasoning(t)) => json!({"reasoning_content": t}),
            Some(Delta::ToolCall(c)) => {
                let i = calls.fetch_add(1, Ordering::SeqCst);
                json!({"tool_calls": [tools::call_json(&c, Some(i))]})
            }
            None => json!({}),
        };
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    });
    let (tok_st, id2, model2) = (st.clone(), id_lp, model_lp);
    let lp_chunk: LogprobFn = Arc::new(move |l: &TokenLogprob| {
        json!({"id": id2, "object": "chat.completion.chunk", "created": created, "model": model2,
            "choices": [{"index": 0, "delta": {}, "logprobs": logprobs::chat_json(tok_st.engine.tokenizer(), std::slice::from_ref(l)), "finish_reason": Value::Null}]})
    });
    sse(
        rx,
        Some(first),
        (chunk, lp_chunk),
        include_usage,
        st.cfg.keepalive_secs,
    )
}

/// `/v1/completions`.
pub(super) async fn completions(State(st): State<Arc<AppState>>, body: Bytes) -> Response {
    let req = match parse(&st, body, completion_request::completion).await {
        Ok(r) => r,
        Err(e) => return error(e),
    };
    let vocab = st.engine.model().vocab_size();
    let tok = st.engine.tokenizer();
    let (tokenize, echo): (Tokenize, _) = match req.prompt.clone() {
        completion_request::CompletionPrompt::Text(p) => {
            let echo = req.sampling.echo.then(|| p.clone());
            (
                Box::new(move |t: &Tokenizer| (t.encode_ordinary(&p), Vec::new())),
                echo,
            )
        }
        completion_request::CompletionPrompt::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
                return error(ApiError::bad(
                    "prompt",
                    format!("prompt token id {bad} is outside the vocabulary ({vocab} ids)"),
                ));
            }
            let echo = req.sampling.echo.then(|| tok.decode(&ids));
            (Box::new(move |_: &Tokenizer| (ids, Vec::new())), echo)
        }
    };
    let want_lp = req.sampling.logprobs.is_some();
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
            Ok(c) => {
                let tok = st.engine.tokenizer();
                let lp = want_lp.then(|| match &echo {
                    Some(_) => logprobs::echo_json(tok, &c.prompt_logprobs, &c.logprobs),
                    None => logprobs::completion_json(tok, &c.logprobs, 0),
                });
                let text = echo.unwrap_or_default() + &c.content;
                Json(json!({"id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": text, "finish_reason": c.finish, "logprobs": lp}], "usage": c.usage}))
                .into_response()
            }
            Err(e) => error(e),
        };
    }
    let (id_lp, model_lp) = (id.clone(), model.clone());
    let chunk: ChunkFn = Arc::new(move |d: Option<Delta>, finish: Value| {
        let text = match d {
            Some(Delta::Content(t)) | Some(Delta::Reasoning(t)) => t,
            Some(Delta::ToolCall(_)) | None => String::new(),
        };
        json!({"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": Value::Null}]})
    });
    // Offsets count the characters of the tokens reported before (the prompt is not echoed).
    let (tok_st, at) = (st.clone(), Arc::new(std::sync::atomic::AtomicUsize::new(0)));
    let lp_chunk: LogprobFn = Arc::new(move |l: &TokenLogprob| {
        let tok = tok_st.engine.tokenizer();
        let off = at.fetch_add(
            String::from_utf8_lossy(&tok.token_bytes(l.id))
                .chars()
                .count(),
            Ordering::SeqCst,
        );
        json!({"id": id_lp, "object": "text_completion", "created": created, "model": model_lp,
            "choices": [{"index": 0, "text": "", "finish_reason": Value::Null,
                "logprobs": logprobs::completion_json(tok, std::slice::from_ref(l), off)}]})
    });
    sse(
        rx,
        None,
        (chunk, lp_chunk),
        include_usage,
        st.cfg.keepalive_secs,
    )
}
