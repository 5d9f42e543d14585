//! Harmony's tool form (gpt-oss), as OpenAI's renderer (openai-harmony) writes it and
//! scripts/harmony_check.py compares token for token: the declared functions as a TypeScript
//! namespace in the developer message (`namespace functions { … type name = (_: { … }) =>
//! any; … }`), an assistant's call as `<|start|>assistant to=functions.NAME<|channel|>commentary
//! <|constrain|>json<|message|>{args}<|call|>`, and a tool's result as
//! `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>` (its text as
//! sent). Each header piece is its own segment, tokenized alone as harmony's renderer does.
//! Owns the tool rendering; the reply side (a `commentary` body addressed `to=functions.NAME`,
//! ended by `<|call|>`) is `HarmonySplitter`'s.

use serde_json::Value;

use super::harmony::{control, text, CALL, CHANNEL, CONSTRAIN, END, MESSAGE, START};
use super::{Message, Segment};
use crate::{Error, Result};

/// The `# Tools` section declaring the OpenAI-style `tools` array (each function's
/// description a `//` line per line, its parameters as `harmony_schema` writes them).
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
        for line in f
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .lines()
        {
            out.push_str(&format!("// {line}\n"));
        }
        match f.get("parameters").filter(|p| !p.is_null()) {
            Some(p) => out.push_str(&format!(
                "type {name} = (_: {}) => any;\n\n",
                super::harmony_schema::ts_type(p, "")
            )),
            None => out.push_str(&format!("type {name} = () => any;\n\n")),
        }
    }
    out.push_str("} // namespace functions");
    Ok(out)
}

/// An assistant message with calls: its text (if any) as analysis unless `drop_analysis`
/// (harmony drops the reasoning of a turn that ended in a final answer), then one call
/// message each.
pub fn render_calls(out: &mut Vec<Segment>, m: &Message, drop_analysis: bool) {
    if !m.content.is_empty() && !drop_analysis {
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
        text(out, "assistant");
        text(out, &format!(" to=functions.{}", c.name));
        control(out, CHANNEL);
        text(out, "commentary");
        text(out, " ");
        control(out, CONSTRAIN);
        text(out, "json");
        control(out, MESSAGE);
        text(out, &c.arguments);
        control(out, CALL);
    }
}

/// A tool's result addressed back to the assistant (`name`: the function it answers).
pub fn render_result(out: &mut Vec<Segment>, name: &str, content: &str) {
    control(out, START);
    text(out, &format!("functions.{name}"));
    text(out, " to=assistant");
    control(out, CHANNEL);
    text(out, "commentary");
    control(out, MESSAGE);
    text(out, content);
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

    /// The developer message of harmony's published tool example, character for character
    /// (properties in the order the request declares them).
    #[test]
    fn tools_render_as_the_published_example() {
        let want = "# Tools\n\n## functions\n\nnamespace functions {\n\n\
// Gets the location of the user.\ntype get_location = () => any;\n\n\
// Gets the current weather in the provided location.\ntype get_current_weather = (_: {\n\
// The city and state, e.g. San Francisco, CA\nlocation: string,\n\
format?: \"celsius\" | \"fahrenheit\", // default: celsius\n}) => any;\n\n\
// Gets the current weather in the provided list of locations.\ntype get_multiple_weathers = (_: {\n\
// List of city and state, e.g. [\"San Francisco, CA\", \"New York, NY\"]\nlocations: string[],\n\
format?: \"celsius\" | \"fahrenheit\", // default: celsius\n\
}) => any;\n\n\
} // namespace functions";
        assert_eq!(tools_section(&weather_tools()).unwrap(), want);
    }

    use crate::chat::segments_text as flat;

    /// openai-harmony's forms (scripts/harmony_check.py compares whole prompts with it).
    #[test]
    fn a_call_and_its_result_render_in_harmony_form() {
        let mut asst = Message::new("assistant", "Need the weather.");
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
        assert!(s.contains("<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_current_weather<|channel|>commentary <|constrain|>json<|message|>{\"location\":\"Tokyo\"}<|call|>"), "{s}");
        assert!(s.ends_with("<|start|>functions.get_current_weather to=assistant<|channel|>commentary<|message|>{\"temp\": 20}<|end|><|start|>assistant"), "{s}");
        // Once the turn ended in a final answer, its reasoning is dropped; the call stays.
        let mut done = msgs.clone();
        done.extend([
            Message::new("assistant", "20 degrees."),
            Message::new("user", "Thanks"),
        ]);
        let s = flat(&render(&done, &opts).unwrap());
        assert!(!s.contains("Need the weather."), "{s}");
        assert!(
            s.contains("<|call|><|start|>functions.get_current_weather"),
            "{s}"
        );
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
            "<|constrain|>",
            "json",
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
        // `<|constrain|>json` right after the recipient, with no space.
        let mut s = HarmonySplitter::new(ids, decode);
        for id in [1003, 6, 7, 8, 1001, 4] {
            s.push(id);
        }
        s.push(1005);
        assert_eq!(s.take_call().as_deref(), Some("get_location"));
    }
}
