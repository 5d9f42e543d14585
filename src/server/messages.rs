//! The `messages` of a chat request: roles, per-role fields, text content (a string or text
//! parts), an assistant's `tool_calls` and a tool result's `tool_call_id`, each checked with a
//! 400 naming the field.

use serde_json::{Map, Value};

use super::validate::ApiError;
use crate::chat::Message;

fn text_content(v: &Value, field: &str) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (
                    p.get("type").and_then(|t| t.as_str()),
                    p.get("text").and_then(|t| t.as_str()),
                ) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (Some(t), _) => {
                        return Err(ApiError::bad(
                            &format!("{field}[{i}].type"),
                            format!("content part type `{t}` is not supported (text only)"),
                        ))
                    }
                    _ => {
                        return Err(ApiError::bad(
                            &format!("{field}[{i}]"),
                            "content parts need a `type`",
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad(
            field,
            "content must be a string or a list of text parts",
        )),
    }
}

/// Validates `messages`: a non-empty list of system (or developer), user, assistant and tool
/// messages.
pub(super) fn messages(m: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let msgs = m
        .get("messages")
        .and_then(|v| v.as_array())
        .ok_or_else(|| ApiError::bad("messages", "`messages` must be a non-empty array"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "`messages` must not be empty"));
    }
    let mut messages = Vec::new();
    for (i, v) in msgs.iter().enumerate() {
        let f = format!("messages[{i}]");
        let o = v
            .as_object()
            .ok_or_else(|| ApiError::bad(&f, "a message must be an object"))?;
        let role = o.get("role").and_then(|r| r.as_str()).unwrap_or("");
        let own = match role {
            "assistant" => "tool_calls",
            "tool" => "tool_call_id",
            _ => "name",
        };
        for k in o.keys() {
            if !["role", "content", "reasoning_content", "name", own].contains(&k.as_str()) {
                return Err(ApiError::bad(
                    &format!("{f}.{k}"),
                    format!("unknown or unsupported message field `{k}`"),
                ));
            }
        }
        let role = o
            .get("role")
            .and_then(|r| r.as_str())
            .ok_or_else(|| ApiError::bad(&format!("{f}.role"), "missing role"))?;
        if !["system", "developer", "user", "assistant", "tool"].contains(&role) {
            return Err(ApiError::bad(
                &format!("{f}.role"),
                format!("role `{role}` is not supported"),
            ));
        }
        // OpenAI's newer name for the system message; K3 has only `system`, and harmony reads
        // a leading system or developer message alike (its developer instructions).
        let role = if role == "developer" { "system" } else { role };
        // Only an assistant message that carries tool calls may go without content (OpenAI
        // refuses the rest with 400 too).
        let has_calls = o.get("tool_calls").is_some_and(|c| !c.is_null());
        if o.get("content").is_none_or(Value::is_null) && !(role == "assistant" && has_calls) {
            return Err(ApiError::bad(
                &format!("{f}.content"),
                format!("a {role} message needs `content` (a string or a list of text parts)"),
            ));
        }
        let mut msg = Message::new(
            role,
            &text_content(
                o.get("content").unwrap_or(&Value::Null),
                &format!("{f}.content"),
            )?,
        );
        msg.reasoning_content = o
            .get("reasoning_content")
            .and_then(|r| r.as_str())
            .map(String::from);
        msg.name = o.get("name").and_then(|r| r.as_str()).map(String::from);
        msg.tool_calls = super::tools::message_calls(o.get("tool_calls"), &f)?;
        if role == "tool" {
            // A tool result names its call by `tool_call_id` (or, as older clients do, its
            // function by `name`).
            msg.tool = msg.name.take();
            msg.tool_call_id = o
                .get("tool_call_id")
                .and_then(|r| r.as_str())
                .map(String::from);
            if msg.tool.is_none() && msg.tool_call_id.is_none() {
                return Err(ApiError::bad(
                    &format!("{f}.tool_call_id"),
                    "a tool message needs `tool_call_id`",
                ));
            }
        }
        messages.push(msg);
    }
    Ok(messages)
}
