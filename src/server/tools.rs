//! Tool calling on the wire: validating `tools`, `tool_choice`, `parallel_tool_calls` and the
//! messages that carry calls and results, and writing calls in OpenAI's shapes (a message's
//! `tool_calls`, streamed `delta.tool_calls`). The format the model reads and writes is the
//! chat module's; nothing here renders or parses it.

use serde_json::{json, Map, Value};

use super::validate::ApiError;
use crate::chat::{ToolCall, ToolChoice};

/// A request's tools.
#[derive(Debug, Clone, Default)]
pub struct ToolRequest {
    /// The declarations (None: no tools).
    pub tools: Option<Value>,
    /// `tool_choice` (`auto` unless given).
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (true unless given).
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether a tools section in the reply is returned as calls.
    pub fn calls_on(&self) -> bool {
        self.choice.returns_calls(self.tools.is_some())
    }
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
}

/// The declared function names, each checked.
fn declared(tools: &[Value]) -> Result<Vec<String>, ApiError> {
    let mut names = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let f = format!("tools[{i}]");
        if t.get("type").and_then(|v| v.as_str()) != Some("function") {
            return Err(ApiError::bad(
                &format!("{f}.type"),
                "a tool's `type` must be `function`",
            ));
        }
        let func = t
            .get("function")
            .and_then(|v| v.as_object())
            .ok_or_else(|| {
                ApiError::bad(&format!("{f}.function"), "a tool needs a `function` object")
            })?;
        let name = func.get("name").and_then(|v| v.as_str()).unwrap_or("");
        if !valid_name(name) {
            return Err(ApiError::bad(
                &format!("{f}.function.name"),
                "a function name is 1 to 64 of a-z, A-Z, 0-9, `_`, `-` and `.`",
            ));
        }
        if func.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(ApiError::bad(
                &format!("{f}.function.parameters"),
                "`parameters` must be a JSON Schema object",
            ));
        }
        if names.iter().any(|n| n == name) {
            return Err(ApiError::bad(
                &format!("{f}.function.name"),
                format!("the function `{name}` is declared twice"),
            ));
        }
        names.push(name.to_string());
    }
    Ok(names)
}

/// Validates `tools`, `tool_choice` and `parallel_tool_calls`.
pub fn request(m: &Map<String, Value>) -> Result<ToolRequest, ApiError> {
    let tools = match m.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        // OpenAI refuses an empty list ("expected an array with minimum length 1"): so do we.
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::bad(
                "tools",
                "`tools` is empty: declare at least one function or leave `tools` out",
            ))
        }
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(ApiError::bad("tools", "`tools` must be a list")),
    };
    let names = declared(&tools)?;
    let choice = match m.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("`tool_choice` `{other}` is not one of auto, none, required"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(|n| n.as_str());
            match (o.get("type").and_then(|t| t.as_str()), name) {
                (Some("function"), Some(n)) if names.iter().any(|d| d == n) => {
                    ToolChoice::Function(n.to_string())
                }
                (Some("function"), Some(n)) => {
                    return Err(ApiError::bad(
                        "tool_choice",
                        format!("`tool_choice` names `{n}`, which `tools` does not declare"),
                    ))
                }
                _ => {
                    return Err(ApiError::bad(
                        "tool_choice",
                        "`tool_choice` is auto, none, required or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    ))
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad(
                "tool_choice",
                "`tool_choice` must be a string or an object",
            ))
        }
    };
    if names.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Err(ApiError::bad(
            "tool_choice",
            "`tool_choice` asks for a call, but `tools` declares none",
        ));
    }
    let parallel = match m.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::bad(
                "parallel_tool_calls",
                "`parallel_tool_calls` must be a boolean",
            ))
        }
    };
    Ok(ToolRequest {
        tools: (!names.is_empty()).then_some(Value::Array(tools)),
        choice,
        parallel,
    })
}

/// An assistant message's `tool_calls` (`f`: the message's field path).
pub fn message_calls(v: Option<&Value>, f: &str) -> Result<Vec<ToolCall>, ApiError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::bad(
                &format!("{f}.tool_calls"),
                "`tool_calls` must be a list",
            ))
        }
    };
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let p = format!("{f}.tool_calls[{i}]");
            let func = c.get("function").and_then(|x| x.as_object());
            let name = func.and_then(|x| x.get("name")).and_then(|x| x.as_str());
            let args = func.and_then(|x| x.get("arguments"));
            let (Some(name), Some(Value::String(args))) = (name, args) else {
                return Err(ApiError::bad(
                    &p,
                    "a tool call needs `function.name` and `function.arguments` (a JSON string)",
                ));
            };
            Ok(ToolCall {
                id: c
                    .get("id")
                    .and_then(|x| x.as_str())
                    .unwrap_or("")
                    .to_string(),
                name: name.to_string(),
                arguments: args.clone(),
            })
        })
        .collect()
}

/// One call in OpenAI's shape (`index` only for streamed deltas).
pub fn call_json(c: &ToolCall, index: Option<usize>) -> Value {
    let mut v = json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}});
    if let Some(i) = index {
        v["index"] = json!(i);
    }
    v
}
