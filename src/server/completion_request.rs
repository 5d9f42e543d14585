//! `/v1/completions` request bodies: the prompt as text or token ids (one prompt per request),
//! `echo`, completions' integer `logprobs`, and the shared sampling fields (`validate`).
//! Fails closed like the rest of `validate`: a 400 naming the field.

use serde_json::Value;

use super::fields::{check_fields, object, COMPLETION};
use super::validate::{alternatives, sampling, ApiError, Sampling};

/// A validated completion request.
#[derive(Debug, Clone)]
pub struct CompletionRequest {
    /// The prompt.
    pub prompt: CompletionPrompt,
    /// Sampling and output settings.
    pub sampling: Sampling,
}

/// A completion's prompt: text, or token ids as benchmark and evaluation clients send them.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionPrompt {
    /// Text, tokenized without special tokens.
    Text(String),
    /// Token ids, fed as they are (checked against the vocabulary by the server).
    Ids(Vec<u32>),
}

/// `prompt`: a string, a list of token ids, or a list holding one of either (OpenAI's batch
/// form with one prompt); several prompts are refused (one prompt per request).
fn completion_prompt(v: Option<&Value>) -> Result<CompletionPrompt, ApiError> {
    let bad = |m: String| ApiError::bad("prompt", m);
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&n| n <= u32::MAX as u64)
                    .map(|n| n as u32)
            })
            .collect()
    };
    let p = match v {
        None => return Err(bad("missing `prompt`".into())),
        Some(Value::String(s)) => CompletionPrompt::Text(s.clone()),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => CompletionPrompt::Ids(
            ids(a).ok_or_else(|| bad("token ids must be non-negative integers".into()))?,
        ),
        Some(Value::Array(a)) if a.len() > 1 => {
            return Err(bad(format!(
                "{} prompts in one request: this server takes one prompt per request (send \
                 them as separate requests; they share passes)",
                a.len()
            )))
        }
        Some(Value::Array(a)) => match a.first() {
            Some(Value::String(s)) => CompletionPrompt::Text(s.clone()),
            Some(Value::Array(inner)) => CompletionPrompt::Ids(
                ids(inner).ok_or_else(|| bad("token ids must be non-negative integers".into()))?,
            ),
            _ => {
                return Err(bad(
                    "`prompt` must be a string, a list of token ids, or a list of one of them"
                        .into(),
                ))
            }
        },
        Some(_) => {
            return Err(bad(
                "`prompt` must be a string, a list of token ids, or a list of one of them".into(),
            ))
        }
    };
    let empty = match &p {
        CompletionPrompt::Text(s) => s.is_empty(),
        CompletionPrompt::Ids(v) => v.is_empty(),
    };
    if empty {
        return Err(bad("`prompt` must not be empty".into()));
    }
    Ok(p)
}

/// Validates a completion request body.
pub fn completion(body: &[u8]) -> Result<CompletionRequest, ApiError> {
    let m = object(body)?;
    check_fields(&m, COMPLETION)?;
    let prompt = completion_prompt(m.get("prompt"))?;
    let mut sampling = sampling(&m)?;
    sampling.logprobs = match m.get("logprobs") {
        Some(Value::Bool(_)) => {
            return Err(ApiError::bad(
                "logprobs",
                "`logprobs` on completions is an integer from 0 to 20",
            ))
        }
        _ => alternatives(&m, "logprobs")?,
    };
    sampling.echo = match m.get("echo") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad("echo", "`echo` must be a boolean")),
    };
    if sampling.echo && sampling.stream {
        return Err(ApiError::bad(
            "echo",
            "`echo` is answered whole: use it without `stream`",
        ));
    }
    if sampling.max_tokens == Some(0) && !sampling.echo {
        return Err(ApiError::bad(
            "max_tokens",
            "`max_tokens` 0 needs `echo: true` (prompt scoring)",
        ));
    }
    Ok(CompletionRequest { prompt, sampling })
}
