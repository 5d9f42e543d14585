//! The K3 chat format ("XTML", spec §4.2): segment-wise rendering (each segment BPE-encoded
//! separately; only control segments may contain special tokens), and the streaming splitter
//! that turns generated text into `reasoning_content` and `content` deltas.

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// One rendered piece.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Special tokens allowed (`<|open|>`, `<|sep|>`, ...).
    Control(String),
    /// Ordinary text: special spellings are plain text here.
    Text(String),
}

/// A chat message.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text content.
    #[serde(default)]
    pub content: String,
    /// Assistant reasoning (rendered in the think block when thinking is on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Optional author name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool name for `tool` messages (else the name of the call `tool_call_id` answers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// An assistant's tool calls, rendered as its tools section.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message with a role and content.
    pub fn new(role: &str, content: &str) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }
}

/// Reasoning effort. Which levels a conversation may use is its format's choice
/// (`ChatFormat::effort`: K3's renderer refuses `medium`, harmony has no `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effort {
    /// low
    Low,
    /// medium (harmony's default)
    Medium,
    /// high
    High,
    /// max (K3's default)
    Max,
}

impl Effort {
    /// Parses `low`, `medium`, `high` or `max`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "low" => Ok(Effort::Low),
            "medium" => Ok(Effort::Medium),
            "high" => Ok(Effort::High),
            "max" => Ok(Effort::Max),
            other => Err(Error::Msg(format!(
                "reasoning effort `{other}` is not accepted (use low, medium, high or max)"
            ))),
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }
}

/// K3's renderer has no `medium` effort (its published renderer refuses it too).
pub const MEDIUM_REFUSED: &str =
    "reasoning effort `medium` is not accepted by K3's chat format (use low, high or max)";

/// Rendering options.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// Thinking on (a think block opens the reply) or off (the reply opens with `response`).
    pub thinking: bool,
    /// Reasoning effort, rendered when thinking is on.
    pub effort: Option<Effort>,
    /// Tools as JSON Schema declarations.
    pub tools: Option<serde_json::Value>,
    /// What `tool_choice` asks (rendered only with tools).
    pub tool_choice: ToolChoice,
    /// Whether several calls in one reply are allowed (`parallel_tool_calls`).
    pub parallel_tool_calls: bool,
    /// `response_format` json_schema: the schema, rendered as a `response-format` system
    /// message (the mask keeps the reply to it; this tells the model what to write).
    pub response_schema: Option<serde_json::Value>,
    /// Today's date (YYYY-MM-DD) for formats that render one (harmony); the caller's clock.
    pub date: Option<String>,
}

impl ChatOptions {
    /// Whether a tools section in the reply is returned as calls (tools declared, and
    /// `tool_choice` is not `none`).
    pub fn calls_on(&self) -> bool {
        self.tool_choice.returns_calls(self.tools.is_some())
    }
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            thinking: true,
            effort: Some(Effort::Max),
            tools: None,
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: true,
            response_schema: None,
            date: None,
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('&', "&amp;").replace('"', "&quot;")
}

fn open_tag(out: &mut Vec<Segment>, tag: &str, attrs: &[(&str, &str)]) {
    out.push(Segment::Control("<|open|>".into()));
    out.push(Segment::Text(tag.into()));
    for (k, v) in attrs {
        out.push(Segment::Text(format!(" {k}")));
        out.push(Segment::Text("=\"".into()));
        out.push(Segment::Text(escape(v)));
        out.push(Segment::Text("\"".into()));
    }
    out.push(Segment::Control("<|sep|>".into()));
}

fn close_tag(out: &mut Vec<Segment>, tag: &str) {
    out.push(Segment::Control("<|close|>".into()));
    out.push(Segment::Text(tag.into()));
    out.push(Segment::Control("<|sep|>".into()));
}

fn end_of_message(out: &mut Vec<Segment>) {
    out.push(Segment::Control("<|end_of_msg|>".into()));
}

/// Renders a conversation and the generation prompt into segments.
pub fn render(messages: &[Message], opts: &ChatOptions) -> Result<Vec<Segment>> {
    let mut out = preamble(opts)?;
    out.extend(render_continuation(messages, opts)?);
    Ok(out)
}

/// The segments that end an assistant turn the model left in `phase` (cut short by a token
/// limit): the open blocks closed as the full rendering would close them, then
/// `<|end_of_msg|>`. With `phase` `Done` (the message was closed) only `<|end_of_msg|>`.
pub fn close_turn(phase: Phase) -> Vec<Segment> {
    let mut out = Vec::new();
    if phase == Phase::Reasoning {
        close_tag(&mut out, "think");
        open_tag(&mut out, "response", &[]);
    }
    match phase {
        Phase::Done => {}
        Phase::Tools => close_tag(&mut out, "tools"),
        _ => close_tag(&mut out, "response"),
    }
    if phase != Phase::Done {
        close_tag(&mut out, "message");
    }
    end_of_message(&mut out);
    out
}

/// `v` with every object's keys in sorted order.
fn sorted_keys(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|k| (k.clone(), sorted_keys(&m[k])))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(sorted_keys).collect()),
        other => other.clone(),
    }
}

/// The system preamble `render` starts with (tool declarations, the thinking effort).
fn preamble(opts: &ChatOptions) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    if let Some(tools) = &opts.tools {
        open_tag(
            &mut out,
            "message",
            &[("role", "system"), ("type", "tool-declare")],
        );
        // K3's renderer writes the declarations with sorted keys (serde_json keeps a request's
        // order, which harmony needs), compact (`,` and `:`).
        let json =
            serde_json::to_string(&sorted_keys(tools)).map_err(|e| Error::Msg(e.to_string()))?;
        out.push(Segment::Text(format!(
            "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n{json}\n```"
        )));
        close_tag(&mut out, "message");
        end_of_message(&mut out);
        tools::render_choice(&mut out, &opts.tool_choice, opts.parallel_tool_calls);
    }
    if let Some(schema) = &opts.response_schema {
        // K3's renderer names a response_format system message, not its words: these are ours.
        open_tag(
            &mut out,
            "message",
            &[("role", "system"), ("type", "response-format")],
        );
        let json =
            serde_json::to_string(&sorted_keys(schema)).map_err(|e| Error::Msg(e.to_string()))?;
        out.push(Segment::Text(format!(
            "Reply with one JSON object that is valid against this JSON Schema.\n\n```json\n{json}\n```"
        )));
        close_tag(&mut out, "message");
        end_of_message(&mut out);
    }
    if opts.thinking {
        if let Some(e) = opts.effort {
            if e == Effort::Medium {
                return Err(Error::Msg(MEDIUM_REFUSED.into()));
            }
            open_tag(
                &mut out,
                "message",
                &[("role", "system"), ("type", "thinking-effort")],
            );
            out.push(Segment::Text(format!(
                "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort={}`.",
                e.as_str()
            )));
            close_tag(&mut out, "message");
            end_of_message(&mut out);
        }
    }
    Ok(out)
}

/// Messages appended to an already rendered conversation, then the generation prompt: what a
/// session feeds for a new turn (no preamble).
pub fn render_continuation(messages: &[Message], opts: &ChatOptions) -> Result<Vec<Segment>> {
    let mut out = Vec::new();
    render_messages(&mut out, messages, opts)?;
    open_tag(&mut out, "message", &[("role", "assistant")]);
    if opts.thinking {
        open_tag(&mut out, "think", &[]);
    } else {
        open_tag(&mut out, "response", &[]);
    }
    Ok(out)
}

/// `render`, with the number of segments after the preamble and after each message: where a
/// later request (another client with the same system prompt, an edited last turn) may diverge.
pub fn render_marked(
    messages: &[Message],
    opts: &ChatOptions,
) -> Result<(Vec<Segment>, Vec<usize>)> {
    let mut out = preamble(opts)?;
    let mut marks = vec![out.len()];
    for at in 0..messages.len() {
        render_message(&mut out, messages, at, opts)?;
        marks.push(out.len());
    }
    out.extend(render_continuation(&[], opts)?);
    Ok((out, marks))
}

/// `encode_segments`, also turning segment counts (`render_marked`'s marks) into token
/// positions.
pub fn encode_marked(tok: &Tokenizer, segs: &[Segment], marks: &[usize]) -> (Vec<u32>, Vec<usize>) {
    let mut ids = Vec::new();
    let mut at = vec![0usize; segs.len() + 1];
    for (i, s) in segs.iter().enumerate() {
        match s {
            Segment::Control(t) => ids.extend(tok.encode(t, true)),
            Segment::Text(t) => ids.extend(tok.encode_ordinary(t)),
        }
        at[i + 1] = ids.len();
    }
    let pos = marks.iter().filter_map(|&m| at.get(m).copied()).collect();
    (ids, pos)
}

/// A finished conversation (preamble and every message, no generation prompt): a training
/// sample, whose assistant turns end the way the model is to end them.
pub fn render_conversation(messages: &[Message], opts: &ChatOptions) -> Result<Vec<Segment>> {
    let mut out = preamble(opts)?;
    render_messages(&mut out, messages, opts)?;
    Ok(out)
}

/// The tool name and 1-based call index a `tool` message answers: its `tool_call_id` looked up
/// in the latest assistant message's calls, else its own `tool` name and its place among the
/// tool messages after that assistant message.
pub(crate) fn tool_target(messages: &[Message], at: usize) -> Result<(String, usize)> {
    let m = &messages[at];
    let asst = messages[..at].iter().rposition(|x| x.role == "assistant");
    let calls = asst.map_or(&[][..], |a| &messages[a].tool_calls[..]);
    if let Some(id) = &m.tool_call_id {
        if let Some(i) = calls.iter().position(|c| c.id == *id) {
            return Ok((
                m.tool.clone().unwrap_or_else(|| calls[i].name.clone()),
                i + 1,
            ));
        }
        if m.tool.is_none() {
            return Err(Error::Msg(format!(
                "tool message answers `{id}`, which no earlier assistant tool call has"
            )));
        }
    }
    let n = messages[asst.map_or(0, |a| a + 1)..at]
        .iter()
        .filter(|x| x.role == "tool")
        .count();
    Ok((m.tool.clone().unwrap_or_default(), n + 1))
}

fn render_messages(out: &mut Vec<Segment>, messages: &[Message], opts: &ChatOptions) -> Result<()> {
    (0..messages.len()).try_for_each(|at| render_message(out, messages, at, opts))
}

/// Renders `messages[at]` (the earlier ones give a tool message its call).
fn render_message(
    out: &mut Vec<Segment>,
    messages: &[Message],
    at: usize,
    opts: &ChatOptions,
) -> Result<()> {
    let m = &messages[at];
    match m.role.as_str() {
        "user" | "system" => {
            let mut attrs = vec![("role", m.role.as_str())];
            if let Some(n) = &m.name {
                attrs.push(("name", n.as_str()));
            }
            open_tag(out, "message", &attrs);
            out.push(Segment::Text(m.content.clone()));
        }
        "assistant" => {
            open_tag(out, "message", &[("role", "assistant")]);
            if opts.thinking {
                open_tag(out, "think", &[]);
                if let Some(r) = m
                    .reasoning_content
                    .as_deref()
                    .filter(|r| !r.trim().is_empty())
                {
                    out.push(Segment::Text(r.to_string()));
                }
                close_tag(out, "think");
            }
            open_tag(out, "response", &[]);
            out.push(Segment::Text(m.content.clone()));
            close_tag(out, "response");
            if !m.tool_calls.is_empty() {
                tools::render_calls(out, &m.tool_calls);
            }
        }
        "tool" => {
            let (tool, idx) = tool_target(messages, at)?;
            let idx = idx.to_string();
            open_tag(
                out,
                "message",
                &[("role", "tool"), ("tool", &tool), ("index", &idx)],
            );
            out.push(Segment::Text(m.content.clone()));
        }
        other => return Err(Error::Msg(format!("unknown message role `{other}`"))),
    }
    close_tag(out, "message");
    end_of_message(out);
    Ok(())
}

/// Encodes segments, each separately (BPE never merges across a boundary).
pub fn encode_segments(tok: &Tokenizer, segs: &[Segment]) -> Vec<u32> {
    let mut ids = Vec::new();
    for s in segs {
        match s {
            Segment::Control(t) => ids.extend(tok.encode(t, true)),
            Segment::Text(t) => ids.extend(tok.encode_ordinary(t)),
        }
    }
    ids
}

/// The concatenated text of segments.
pub fn segments_text(segs: &[Segment]) -> String {
    segs.iter()
        .map(|s| match s {
            Segment::Control(t) | Segment::Text(t) => t.as_str(),
        })
        .collect()
}

pub mod chatml;
mod force;
pub mod format;
pub mod harmony;
mod harmony_format;
pub mod harmony_schema;
pub mod harmony_tools;
mod json_mask;
mod json_reply;
mod json_schema;
mod schema_machine;
mod splitter;
mod tools;
pub use chatml::ChatMl;
pub use force::{Script, ToolForcer};
pub use format::{ChatFormat, ReplySplitter, Xtml};
pub use harmony_format::{harmony_ids, Harmony};
pub use json_mask::{token_table, JsonMask, JsonState};
pub use json_reply::JsonReply;
pub use json_schema::{Schema, SchemaError};
pub use schema_machine::SchemaMachine;
pub use splitter::{ChatSplitter, Delta, Phase};
pub use tools::{parse_call, ToolCall, ToolChoice};

#[cfg(test)]
mod tests;
