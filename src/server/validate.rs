//! Request validation that fails closed: unknown or unsupported fields are a 400 naming the
//! field, before any inference. This file holds the error type, the fields both endpoints
//! share (sampling, stop sequences, log-probabilities) and chat bodies; completion bodies are
//! `completion_request`'s.

use serde_json::{Map, Value};

use crate::chat::Message;

use super::fields::{check_fields, object, CHAT};

/// An OpenAI-shaped error.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Message.
    pub message: String,
    /// Offending field.
    pub param: Option<String>,
    /// Error type.
    pub kind: &'static str,
    /// Seconds a 429's `Retry-After` says (1 when `None`).
    pub retry_secs: Option<u64>,
}

impl ApiError {
    /// This error with `Retry-After: secs`.
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_secs = Some(secs);
        self
    }

    /// A 400 about `param`.
    pub fn bad(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.into()),
            kind: "invalid_request_error",
            retry_secs: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": Value::Null}})
    }
}

/// Settings common to both endpoints.
#[derive(Debug, Clone)]
pub struct Sampling {
    /// Streaming response.
    pub stream: bool,
    /// Include a usage chunk when streaming.
    pub include_usage: bool,
    /// Requested token limit.
    pub max_tokens: Option<usize>,
    /// The field that gave it (`max_tokens` or `max_completion_tokens`), for errors.
    pub max_tokens_param: &'static str,
    /// Temperature (None or 0: greedy).
    pub temperature: f64,
    /// Nucleus mass.
    pub top_p: f64,
    /// Seed for sampling.
    pub seed: Option<u64>,
    /// Stop sequences (up to 4), matched on the decoded text.
    pub stop: Vec<String>,
    /// Report log-probabilities with this many alternatives per token (None: none).
    pub logprobs: Option<usize>,
    /// Completions: the prompt comes back before the text (and, with `logprobs`, is scored).
    pub echo: bool,
}

/// A validated chat request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// Conversation.
    pub messages: Vec<Message>,
    /// Reasoning effort (`low`/`high`/`max`).
    pub effort: Option<String>,
    /// Thinking on/off.
    pub thinking: bool,
    /// Sampling and output settings.
    pub sampling: Sampling,
    /// Tools, `tool_choice` and `parallel_tool_calls`.
    pub tools: super::tools::ToolRequest,
    /// `response_format`: a JSON object or a schema the reply is masked to (None: text).
    pub json: Option<JsonFormat>,
}

pub(super) fn sampling(m: &Map<String, Value>) -> Result<Sampling, ApiError> {
    let num = |k: &str| -> Result<Option<f64>, ApiError> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| ApiError::bad(k, format!("`{k}` must be a number"))),
        }
    };
    if let Some(n) = num("n")? {
        if n != 1.0 {
            return Err(ApiError::bad("n", "only n = 1 is supported"));
        }
    }
    let stop = stop_sequences(m.get("stop"))?;
    for k in ["presence_penalty", "frequency_penalty"] {
        if num(k)?.is_some_and(|v| v != 0.0) {
            return Err(ApiError::bad(k, format!("`{k}` is not supported")));
        }
    }
    let stream = match m.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("stream", "`stream` must be a boolean")),
    };
    let include_usage = match m.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            if let Some(k) = o.keys().find(|k| *k != "include_usage") {
                return Err(ApiError::bad(
                    &format!("stream_options.{k}"),
                    format!("unknown field `{k}`"),
                ));
            }
            o.get("include_usage")
                .and_then(|v| v.as_bool())
                .unwrap_or(false)
        }
        Some(_) => {
            return Err(ApiError::bad(
                "stream_options",
                "`stream_options` must be an object",
            ))
        }
    };
    // Each spelling checked under its own name; with both, the smaller one holds.
    let mut max_tokens: Option<usize> = None;
    let mut max_tokens_param = "max_tokens";
    for k in ["max_tokens", "max_completion_tokens"] {
        let n = match num(k)? {
            // Beyond 2^53 an f64 no longer holds every integer: no context is that long.
            Some(v) if v >= 0.0 && v.fract() == 0.0 && v < 9.007_199_254_740_992e15 => v as usize,
            Some(_) => {
                return Err(ApiError::bad(
                    k,
                    format!("`{k}` must be a non-negative integer below 2^53"),
                ))
            }
            None => continue,
        };
        if max_tokens.is_none_or(|m| n < m) {
            (max_tokens, max_tokens_param) = (Some(n), k);
        }
    }
    let temperature = num("temperature")?.unwrap_or(0.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad(
            "temperature",
            "`temperature` must be between 0 and 2",
        ));
    }
    let top_p = num("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad("top_p", "`top_p` must be in (0, 1]"));
    }
    let seed = match num("seed")? {
        Some(v) if v >= 0.0 && v.fract() == 0.0 => Some(v as u64),
        Some(_) => {
            return Err(ApiError::bad(
                "seed",
                "`seed` must be a non-negative integer",
            ))
        }
        None => None,
    };
    Ok(Sampling {
        stream,
        include_usage,
        max_tokens,
        max_tokens_param,
        temperature,
        top_p,
        seed,
        stop,
        logprobs: None,
        echo: false,
    })
}

/// A count in `0..=20` (`top_logprobs`, completions' `logprobs`).
pub(super) fn alternatives(m: &Map<String, Value>, k: &str) -> Result<Option<usize>, ApiError> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= 20 => Ok(Some(n as usize)),
            _ => Err(ApiError::bad(
                k,
                format!("`{k}` must be an integer from 0 to 20"),
            )),
        },
    }
}

/// Chat: `logprobs: true` and `top_logprobs` (0–20, only with `logprobs`).
fn chat_logprobs(m: &Map<String, Value>) -> Result<Option<usize>, ApiError> {
    let on = match m.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("logprobs", "`logprobs` must be a boolean")),
    };
    match (on, alternatives(m, "top_logprobs")?) {
        (true, n) => Ok(Some(n.unwrap_or(0))),
        (false, Some(_)) => Err(ApiError::bad(
            "top_logprobs",
            "`top_logprobs` needs `logprobs: true`",
        )),
        (false, None) => Ok(None),
    }
}

/// Longest stop sequence (each is matched against the text at every token).
const MAX_STOP_BYTES: usize = 1024;

/// `stop`: a string or a list of up to 4 non-empty strings of at most `MAX_STOP_BYTES`.
fn stop_sequences(v: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = |m: &str| ApiError::bad("stop", m);
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(String::from))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("`stop` must be a string or a list of strings"))?,
        Some(_) => return Err(bad("`stop` must be a string or a list of strings")),
    };
    if list.len() > 4 {
        return Err(bad("`stop` holds at most 4 sequences"));
    }
    if list.iter().any(|s| s.is_empty()) {
        return Err(bad("a stop sequence must not be empty"));
    }
    if let Some(s) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(bad(&format!(
            "a stop sequence is {} bytes; at most {MAX_STOP_BYTES}",
            s.len()
        )));
    }
    Ok(list)
}

/// Parses and checks a chat completion body: a request, or a 400 naming the field.
pub fn chat(body: &[u8]) -> Result<ChatRequest, ApiError> {
    let m = object(body)?;
    check_fields(&m, CHAT)?;
    let messages = super::messages::messages(&m)?;
    let effort = match m.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            crate::chat::Effort::parse(s)
                .map_err(|e| ApiError::bad("reasoning_effort", e.to_string()))?;
            Some(s.clone())
        }
        Some(_) => {
            return Err(ApiError::bad(
                "reasoning_effort",
                "`reasoning_effort` must be a string",
            ))
        }
    };
    let thinking = match m.get("thinking") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("thinking", "`thinking` must be a boolean")),
    };
    let mut sampling = sampling(&m)?;
    if sampling.max_tokens == Some(0) {
        let k = sampling.max_tokens_param;
        return Err(ApiError::bad(k, format!("`{k}` must be at least 1")));
    }
    sampling.logprobs = chat_logprobs(&m)?;
    Ok(ChatRequest {
        messages,
        effort,
        thinking,
        sampling,
        tools: super::tools::request(&m)?,
        json: response_format(m.get("response_format"))?,
    })
    .and_then(|r| match r.json.is_some() && r.tools.calls_on() {
        true => Err(ApiError::bad(
            "response_format",
            "`response_format` json_object/json_schema and tool calls cannot be combined (use tool_choice none)",
        )),
        false => Ok(r),
    })
}

/// What `response_format` asks the reply to be.
#[derive(Debug, Clone)]
pub enum JsonFormat {
    /// `json_object`: one JSON object.
    Object,
    /// `json_schema`: a value valid against the compiled schema (and the schema as sent).
    Schema(std::sync::Arc<crate::chat::Schema>, Value),
}

/// `response_format`: `text` (the default), `json_object` or `json_schema` (its `schema`
/// compiled here, so that a schema outside the mask's subset is a 400 naming the keyword).
fn response_format(v: Option<&Value>) -> Result<Option<JsonFormat>, ApiError> {
    let bad = |m: String| ApiError::bad("response_format", m);
    let o = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("`response_format` must be an object".into())),
    };
    match o.get("type").and_then(|t| t.as_str()).unwrap_or("") {
        "text" => Ok(None),
        "json_object" => Ok(Some(JsonFormat::Object)),
        "json_schema" => {
            let js = o
                .get("json_schema")
                .and_then(|j| j.as_object())
                .ok_or_else(|| {
                    bad(
                        "`response_format.json_schema` must be an object with `name` and `schema`"
                            .into(),
                    )
                })?;
            let name_ok = js.get("name").and_then(|n| n.as_str()).is_some_and(|n| {
                (1..=64).contains(&n.len())
                    && n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            });
            if !name_ok {
                return Err(bad(
                    "`response_format.json_schema.name` must be 1-64 of a-z, A-Z, 0-9, _ and -"
                        .into(),
                ));
            }
            match js.get("schema") {
                None | Some(Value::Null) => Ok(Some(JsonFormat::Object)),
                Some(s) => crate::chat::Schema::compile(s)
                    .map(|c| Some(JsonFormat::Schema(std::sync::Arc::new(c), s.clone())))
                    .map_err(|e| bad(format!("`response_format.json_schema.schema` {e}"))),
            }
        }
        other => Err(bad(format!(
            "`response_format` type `{other}` is not one of text, json_object, json_schema"
        ))),
    }
}
