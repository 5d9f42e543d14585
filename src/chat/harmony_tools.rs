//! Harmony's tool form (gpt-oss), as the published chat template writes it: the declared
//! functions as a TypeScript namespace in the developer message (`namespace functions { …
//! type name = (_: { … }) => any; … }`), an assistant's call as
//! `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{args}<|call|>`,
//! and a tool's result as `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>
//! "…"<|end|>` (its text as a JSON string). Owns the tool rendering; the reply side (a
//! `commentary` body addressed `to=functions.NAME`, ended by `<|call|>`) is `HarmonySplitter`'s.

use serde_json::Value;

use super::harmony::{control, text, CALL, CHANNEL, END, MESSAGE, START};
use super::{Message, Segment};
use crate::{Error, Result};

/// The `# Tools` section declaring the OpenAI-style `tools` array.
pub fn tools_section(tools: &Value) -> Result<String> {
    let list = tools
        .as_array()
        .ok_or_else(|| Error::Msg("tools must be an array".into()))?;
    let mut out = String::from("# Tools\n\n## functions\n\nnamespace functions {\n\n");
    for t in list {
        let f = t.get("function").unwrap_or(t);
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::Msg("a tool has no function name".into()))?;
        if let Some(d) = f.get("description").and_then(Value::as_str) {
            out.push_str(&format!("// {d}\n"));
        }
        out.push_str(&format!("type {name} = "));
        let params = f.get("parameters");
        match params
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object)
        {
            Some(props) if !props.is_empty() => {
                let required = required(params);
                out.push_str("(_: {\n");
                for (k, spec) in props {
                    out.push_str(&field(k, spec, &required));
                }
                out.push_str("}) => any;\n\n");
            }
            _ => out.push_str("() => any;\n\n"),
        }
    }
    out.push_str("} // namespace functions");
    Ok(out)
}

fn required(params: Option<&Value>) -> Vec<String> {
    params
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// One property line (with its description as a comment, `?` when optional, and the default).
fn field(name: &str, spec: &Value, required: &[String]) -> String {
    let mut out = String::new();
    if let Some(d) = spec.get("description").and_then(Value::as_str) {
        out.push_str(&format!("// {d}\n"));
    }
    let opt = if required.iter().any(|r| r == name) {
        ""
    } else {
        "?"
    };
    out.push_str(&format!("{name}{opt}: {}", ts_type(spec)));
    if let Some(d) = spec.get("default") {
        out.push_str(&format!(", // default: {}", default_text(d, spec)));
        out.push('\n');
    } else {
        out.push_str(",\n");
    }
    out
}

fn default_text(d: &Value, spec: &Value) -> String {
    match (d, spec.get("enum")) {
        (Value::String(s), Some(_)) => s.clone(),
        _ => d.to_string(),
    }
}

/// A JSON Schema as a TypeScript type (strings with an enum as a union of literals, integers as
/// numbers, arrays of their item type, nested objects inline, unions with `|`).
pub fn ts_type(spec: &Value) -> String {
    if let Some(e) = spec.get("enum").and_then(Value::as_array) {
        return e
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join(" | ");
    }
    if let Some(any) = spec
        .get("anyOf")
        .or_else(|| spec.get("oneOf"))
        .and_then(Value::as_array)
    {
        return any.iter().map(ts_type).collect::<Vec<_>>().join(" | ");
    }
    let one = |t: &str| match t {
        "string" => "string".to_string(),
        "number" | "integer" => "number".to_string(),
        "boolean" => "boolean".to_string(),
        "null" => "null".to_string(),
        "array" => match spec.get("items") {
            Some(i) => format!("{}[]", ts_type(i)),
            None => "any[]".to_string(),
        },
        "object" => match spec.get("properties").and_then(Value::as_object) {
            Some(p) if !p.is_empty() => {
                let req = required(Some(spec));
                let body: String = p.iter().map(|(k, s)| field(k, s, &req)).collect();
                format!("{{\n{body}}}")
            }
            _ => "object".to_string(),
        },
        _ => "any".to_string(),
    };
    match spec.get("type") {
        Some(Value::String(t)) => one(t),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(one)
            .collect::<Vec<_>>()
            .join(" | "),
        _ => "any".to_string(),
    }
}

/// An assistant message with calls: its text (if any) as analysis, then one call message each.
pub fn render_calls(out: &mut Vec<Segment>, m: &Message) {
    if !m.content.is_empty() {
        control(out, START);
        text(out, "assistant");
        control(out, CHANNEL);
        text(out, "analysis");
        control(out, MESSAGE);
        text(out, &m.content);
        control(out, END);
    }
    for c in &m.tool_calls {
        control(out, START);
        text(out, &format!("assistant to=functions.{}", c.name));
        control(out, CHANNEL);
        text(out, "commentary json");
        control(out, MESSAGE);
        text(out, &c.arguments);
        control(out, CALL);
    }
}

/// A tool's result addressed back to the assistant (`name`: the function it answers).
pub fn render_result(out: &mut Vec<Segment>, name: &str, content: &str) {
    control(out, START);
    text(out, &format!("functions.{name} to=assistant"));
    control(out, CHANNEL);
    text(out, "commentary");
    control(out, MESSAGE);
    text(out, &Value::String(content.to_string()).to_string());
    control(out, END);
}

#[cfg(test)]
mod tests {
    use super::super::harmony::{render, HarmonyIds, HarmonyOptions, HarmonySplitter};
    use super::super::ToolCall;
    use super::*;
    use serde_json::json;

    fn weather_tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_location",
                "description": "Gets the location of the user."}},
            {"type": "function", "function": {"name": "get_current_weather",
                "description": "Gets the current weather in the provided location.",
                "parameters": {"type": "object", "properties": {
                    "location": {"type": "string",
                        "description": "The city and state, e.g. San Francisco, CA"},
                    "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                        "default": "celsius"}},
                    "required": ["location"]}}},
            {"type": "function", "function": {"name": "get_multiple_weathers",
                "description": "Gets the current weather in the provided list of locations.",
                "parameters": {"type": "object", "properties": {
                    "locations": {"type": "array", "items": {"type": "string"},
                        "description": "List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]"},
                    "format": {"type": "string", "enum": ["celsius", "fahrenheit"],
                        "default": "celsius"}},
                    "required": ["locations"]}}}
        ])
    }

    /// The developer message of harmony's published tool example, character for character,
    /// but for the order of each function's properties: the request's JSON is held as a sorted
    /// map (the crate's JSON schema machine relies on it), so `format` comes before `location`
    /// where the example, keeping the written order, has it after.
    #[test]
    fn tools_render_as_the_published_example() {
        let want = "# Tools\n\n## functions\n\nnamespace functions {\n\n\
// Gets the location of the user.\ntype get_location = () => any;\n\n\
// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n\
format?: \"celsius\" | \"fahrenheit\", // default: celsius\n\
// The city and state, e.g. San Francisco, CA\nlocation: string,\n}) => any;\n\n\
// Gets the current weather in the provided list of locations.\ntype get_multiple_weathers = (_: {\n\
format?: \"celsius\" | \"fahrenheit\", // default: celsius\n\
// List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]\nlocations: string[],\n\
}) => any;\n\n\
} // namespace functions";
        assert_eq!(tools_section(&weather_tools()).unwrap(), want);
    }

    use crate::chat::segments_text as flat;

    #[test]
    fn a_call_and_its_result_render_in_the_template_form() {
        let mut asst = Message::new("assistant", "");
        asst.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "get_current_weather".into(),
            arguments: r#"{"location":"Tokyo"}"#.into(),
        }];
        let mut result = Message::new("tool", r#"{"temp": 20}"#);
        result.tool_call_id = Some("call_1".into());
        let msgs = vec![Message::new("user", "Weather?"), asst, result];
        let opts = HarmonyOptions {
            tools: Some(weather_tools()),
            ..Default::default()
        };
        let s = flat(&render(&msgs, &opts).unwrap());
        assert!(
            s.contains(
                "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
            ),
            "{s}"
        );
        assert!(
            s.contains("<|start|>developer<|message|># Tools\n\n## functions"),
            "{s}"
        );
        assert!(s.contains("<|start|>assistant to=functions.get_current_weather<|channel|>commentary json<|message|>{\"location\":\"Tokyo\"}<|call|>"), "{s}");
        assert!(s.ends_with("<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 20}\"<|end|><|start|>assistant"), "{s}");
    }

    /// A call in either header placement (`to=` after the role or after the channel) ends as
    /// the call of that function; a commentary preamble without a recipient is not a call.
    #[test]
    fn the_splitter_reads_calls_in_both_placements() {
        // Ids: specials 1000.., words one id each.
        let words = [
            "assistant",
            " to=functions.get_current_weather",
            "commentary",
            " json",
            "{\"location\":",
            "\"Tokyo\"}",
            "commentary to=functions.get_location",
        ];
        let ids = HarmonyIds {
            start: 1000,
            message: 1001,
            end: 1002,
            channel: 1003,
            ret: 1004,
            call: 1005,
        };
        let decode = move |i: &[u32]| -> String {
            i.iter()
                .filter_map(|&x| words.get(x as usize))
                .copied()
                .collect()
        };
        // `to=` after the role.
        let mut s = HarmonySplitter::new(ids, decode);
        for id in [1, 1003, 2, 3, 1001, 4, 5] {
            s.push(id);
        }
        assert_eq!(s.take_call(), None);
        s.push(1005);
        assert_eq!(s.take_call().as_deref(), Some("get_current_weather"));
        // `to=` after the channel (one header word here), after a preamble with no recipient.
        let mut s = HarmonySplitter::new(ids, decode);
        let mut bodies = Vec::new();
        for id in [1003, 2, 1001, 4, 1002, 1000, 0, 1003, 6, 1001, 5, 1005] {
            bodies.push(s.push(id));
        }
        use super::super::harmony::Channel;
        assert_eq!(bodies[3], Some(Channel::Other), "a preamble is not a call");
        assert_eq!(bodies[10], Some(Channel::Call));
        assert_eq!(s.take_call().as_deref(), Some("get_location"));
    }
}
