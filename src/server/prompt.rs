//! A validated chat request turned into what the model is fed: the rendering options (effort
//! resolved against the server's default and the format's, tools, `tool_choice`, the date) and
//! the prompt's ids. Shared by `/v1/chat/completions` and `deltafin render`, so that the
//! prompt a check compares is the prompt `serve` runs. Owns no HTTP and no generation.

use super::validate::{ApiError, ChatRequest, JsonFormat};
use crate::chat::{encode_marked, ChatFormat, ChatOptions};
use crate::tokenizer::Tokenizer;

/// The options `format` renders `req` with (`default_effort`: the server's, else the
/// format's; `date`: harmony's `Current date:`).
pub fn chat_options(
    req: &ChatRequest,
    format: &dyn ChatFormat,
    default_effort: Option<&str>,
    date: Option<String>,
) -> Result<ChatOptions, ApiError> {
    let effort = match req.thinking {
        true => Some(
            format
                .effort(req.effort.as_deref(), default_effort)
                .map_err(|e| ApiError::bad("reasoning_effort", e.to_string()))?,
        ),
        false => None,
    };
    Ok(ChatOptions {
        thinking: req.thinking,
        effort,
        tools: req.tools.tools.clone(),
        tool_choice: req.tools.choice.clone(),
        parallel_tool_calls: req.tools.parallel,
        response_schema: match &req.json {
            Some(JsonFormat::Schema(_, v)) => Some(v.clone()),
            _ => None,
        },
        date,
    })
}

/// The prompt ids of a chat request body as `serve` renders it, with the ids' positions
/// after the preamble and after each message.
pub fn render_chat(
    body: &[u8],
    format: &dyn ChatFormat,
    tok: &Tokenizer,
    default_effort: Option<&str>,
    date: Option<String>,
) -> Result<(Vec<u32>, Vec<usize>), ApiError> {
    let req = super::validate::chat(body)?;
    let opts = chat_options(&req, format, default_effort, date)?;
    let (segs, marks) = format
        .render(&req.messages, &opts)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    Ok(encode_marked(tok, &segs, &marks))
}
