//! The fields a request body may hold, per route (`COMMON`, `CHAT`, `COMPLETION`), the ones
//! refused by name (`UNSUPPORTED`), and the first checks of a body: a JSON object whose every
//! field is known. `docs/server.md`'s table of request fields is checked against these lists
//! (the test below). Knows nothing of what a field's value means (`validate.rs` does).

use serde_json::{Map, Value};

use super::validate::ApiError;

/// The fields every completion route takes.
pub(super) const COMMON: &[&str] = &[
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "n",
    "user",
    "stop",
    "logprobs",
    "presence_penalty",
    "frequency_penalty",
];
/// The fields only chat completions take.
pub(super) const CHAT: &[&str] = &[
    "messages",
    "reasoning_effort",
    "max_completion_tokens",
    "thinking",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
];
/// The fields only completions take.
pub(super) const COMPLETION: &[&str] = &["prompt", "echo"];
/// Fields refused by name (a 400 saying they are not supported).
pub(super) const UNSUPPORTED: &[&str] = &[
    "functions",
    "function_call",
    "logit_bias",
    "suffix",
    "best_of",
];

/// The body as a JSON object, or a 400 naming `body`.
pub(super) fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad("body", format!("request body is not valid JSON: {e}")))?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::bad("body", "request body must be a JSON object")),
    }
}

/// A 400 naming the first field that is refused or unknown (`extra`: the route's own fields).
pub(super) fn check_fields(m: &Map<String, Value>, extra: &[&str]) -> Result<(), ApiError> {
    for k in m.keys() {
        if UNSUPPORTED.contains(&k.as_str()) {
            return Err(ApiError::bad(
                k,
                format!("`{k}` is not supported by this server"),
            ));
        }
        if !COMMON.contains(&k.as_str()) && !extra.contains(&k.as_str()) {
            return Err(ApiError::bad(k, format!("unknown field `{k}`")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{CHAT, COMMON, COMPLETION, UNSUPPORTED};

    /// docs/server.md's table of request fields lists exactly the fields the server accepts
    /// (and the ones it refuses by name), so the guide cannot drift from the parser.
    #[test]
    fn the_guide_lists_every_request_field() {
        let doc = include_str!("../../docs/server.md");
        let start = doc
            .find("## Request fields")
            .expect("a request-fields section");
        let table: Vec<&str> = doc[start..]
            .lines()
            .skip(1)
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .collect();
        let listed: Vec<&str> = table
            .iter()
            .filter_map(|row| row.split('`').nth(1))
            .collect();
        let mut known: Vec<&str> = [COMMON, CHAT, COMPLETION, UNSUPPORTED].concat();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        known.sort_unstable();
        assert_eq!(sorted, known, "docs/server.md's request fields");
        for row in &table {
            let field = row.split('`').nth(1).unwrap_or_default();
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let (chat, completion) = (cells[2] == "yes", cells[3] == "yes");
            let want_chat = COMMON.contains(&field) || CHAT.contains(&field);
            let want_completion = COMMON.contains(&field) || COMPLETION.contains(&field);
            assert_eq!((chat, completion), (want_chat, want_completion), "{field}");
        }
    }
}
