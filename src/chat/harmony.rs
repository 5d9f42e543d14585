//! OpenAI's harmony chat format (gpt-oss): rendering a conversation to segments, and splitting a
//! reply into reasoning and content on token ids. Rendering, as OpenAI's openai-harmony
//! library lays it out (scripts/harmony_check.py compares the two token for token): a system
//! block (identity, knowledge cutoff, the caller's date, reasoning effort, the valid channels),
//! a developer block holding the first system/developer message under `# Instructions`, user
//! turns, earlier assistant turns as `final`-channel messages (their reasoning dropped), and
//! `<|start|>assistant` to generate. A reply is
//! `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`:
//! the splitter reads headers (role, channel) between `<|start|>`/`<|channel|>` and
//! `<|message|>`, bodies up to `<|end|>`, `<|return|>` or `<|call|>`, never matching text.
//! Tools (the TypeScript namespace, calls and results) are `harmony_tools`'; a reply's call is a
//! `commentary` body whose header says `to=functions.NAME`, ended by `<|call|>`. Owns the format;
//! must not touch the model.

use super::{Message, Segment};
use crate::{Error, Result};

/// The specials harmony uses, as text.
pub const START: &str = "<|start|>";
/// Ends a header, starts a body.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message the conversation continues after.
pub const END: &str = "<|end|>";
/// Names the channel in a header.
pub const CHANNEL: &str = "<|channel|>";
/// Ends the reply.
pub const RETURN: &str = "<|return|>";
/// Ends a tool call.
pub const CALL: &str = "<|call|>";
/// Marks a body's format in a header (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";

/// gpt-oss's reasoning effort (the system block's `Reasoning:` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reasoning {
    /// low
    Low,
    /// medium (the template's default)
    #[default]
    Medium,
    /// high
    High,
}

impl Reasoning {
    fn name(self) -> &'static str {
        match self {
            Reasoning::Low => "low",
            Reasoning::Medium => "medium",
            Reasoning::High => "high",
        }
    }
}

/// How to render a harmony conversation.
#[derive(Debug, Clone)]
pub struct HarmonyOptions {
    /// `Current date:` (YYYY-MM-DD; the caller's clock: the library reads none).
    pub date: String,
    /// Reasoning effort.
    pub reasoning: Reasoning,
    /// The model identity line.
    pub identity: String,
    /// Declared functions (OpenAI `tools`), rendered as harmony's TypeScript namespace.
    pub tools: Option<serde_json::Value>,
}

impl Default for HarmonyOptions {
    fn default() -> Self {
        HarmonyOptions {
            date: "2026-01-01".into(),
            reasoning: Reasoning::Medium,
            identity: "You are ChatGPT, a large language model trained by OpenAI.".into(),
            tools: None,
        }
    }
}

pub(super) fn control(out: &mut Vec<Segment>, s: &str) {
    out.push(Segment::Control(s.into()));
}

pub(super) fn text(out: &mut Vec<Segment>, s: &str) {
    if !s.is_empty() {
        out.push(Segment::Text(s.into()));
    }
}

/// One message `<|start|>{head}<|message|>{body}{close}`.
fn message(out: &mut Vec<Segment>, head: &[(&str, bool)], body: &str, close: &str) {
    control(out, START);
    for (s, special) in head {
        if *special {
            control(out, s);
        } else {
            text(out, s);
        }
    }
    control(out, MESSAGE);
    text(out, body);
    control(out, close);
}

/// `messages` rendered for generation (ending in `<|start|>assistant`).
pub fn render(messages: &[Message], opts: &HarmonyOptions) -> Result<Vec<Segment>> {
    Ok(render_marked(messages, opts)?.0)
}

/// `render`, with the number of segments after the system and developer blocks and after each
/// message: where a later request may diverge (the prompt cache's cut points).
pub fn render_marked(
    messages: &[Message],
    opts: &HarmonyOptions,
) -> Result<(Vec<Segment>, Vec<usize>)> {
    let mut out = Vec::new();
    let mut system = format!(
        "{}\nKnowledge cutoff: 2024-06\nCurrent date: {}\n\nReasoning: {}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.",
        opts.identity,
        opts.date,
        opts.reasoning.name()
    );
    if opts.tools.is_some() {
        system.push_str("\nCalls to these tools must go to the commentary channel: 'functions'.");
    }
    message(&mut out, &[("system", false)], &system, END);
    let skip = match messages.first() {
        Some(m) if m.role == "system" || m.role == "developer" => 1,
        _ => 0,
    };
    let developer = messages[..skip].first().filter(|d| !d.content.is_empty());
    let mut body = String::new();
    if let Some(d) = developer {
        body = format!("# Instructions\n\n{}", d.content);
    }
    if let Some(t) = &opts.tools {
        if !body.is_empty() {
            body.push_str("\n\n");
        }
        body.push_str(&super::harmony_tools::tools_section(t)?);
    }
    if !body.is_empty() {
        message(&mut out, &[("developer", false)], &body, END);
    }
    let mut marks = vec![out.len()];
    let drop_before = analysis_dropped_before(&messages[skip..]).map(|i| i + skip);
    for (at, m) in messages.iter().enumerate().skip(skip) {
        match m.role.as_str() {
            "user" => message(&mut out, &[("user", false)], &m.content, END),
            "assistant" if !m.tool_calls.is_empty() => super::harmony_tools::render_calls(
                &mut out,
                m,
                drop_before.is_some_and(|d| at < d),
            ),
            // Earlier turns keep only their final answer (the template drops reasoning).
            "assistant" => message(
                &mut out,
                &[("assistant", false), (CHANNEL, true), ("final", false)],
                &m.content,
                END,
            ),
            "tool" => {
                let (name, _) = super::tool_target(messages, at)?;
                if name.is_empty() {
                    return Err(Error::Msg(
                        "gpt-oss: a tool message needs the call it answers (tool_call_id) or the function's name".into(),
                    ));
                }
                super::harmony_tools::render_result(&mut out, &name, &m.content);
            }
            other => {
                return Err(Error::Msg(format!(
                    "gpt-oss: a `{other}` message here is not supported (system/developer first, then user, assistant and tool)"
                )))
            }
        }
        marks.push(out.len());
    }
    control(&mut out, START);
    text(&mut out, "assistant");
    Ok((out, marks))
}

/// Where harmony stops dropping reasoning: when the conversation's last assistant message is a
/// final answer, the analysis messages before its first final answer are left out (earlier
/// turns' reasoning is not shown to the model again; a tool chain still under way keeps its).
/// An assistant message renders as a final answer when it has no calls.
fn analysis_dropped_before(messages: &[Message]) -> Option<usize> {
    let is_final = |m: &Message| m.role == "assistant" && m.tool_calls.is_empty();
    let last = messages.iter().rev().find(|m| m.role == "assistant")?;
    if !is_final(last) {
        return None;
    }
    messages.iter().position(is_final)
}

/// The token ids of harmony's specials in one vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HarmonyIds {
    /// `<|start|>`
    pub start: u32,
    /// `<|message|>`
    pub message: u32,
    /// `<|end|>`
    pub end: u32,
    /// `<|channel|>`
    pub channel: u32,
    /// `<|return|>`
    pub ret: u32,
    /// `<|call|>`
    pub call: u32,
}

/// Where a reply stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// Reading a header (role, `to=`, channel); `channel` collects the channel's ids.
    Header { in_channel: bool },
    /// Inside a body of this channel.
    Body(Channel),
    /// The reply ended (`<|return|>` or `<|call|>`).
    Done,
}

/// A body's channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `analysis`: reasoning.
    Analysis,
    /// `final`: the answer.
    Final,
    /// `commentary` (tool preambles), or a channel the model made up.
    Other,
    /// A body addressed to a function (`to=functions.NAME`): a call's arguments.
    Call,
}

/// Turns ids into text (a channel name).
type Decoder = Box<dyn Fn(&[u32]) -> String + Send + Sync>;

/// Splits a reply's ids into channels: `push` returns which channel an id's text belongs to
/// (`None` for format tokens). The reply starts inside the assistant header that
/// `render` opened.
pub struct HarmonySplitter {
    ids: HarmonyIds,
    part: Part,
    channel: Vec<u32>,
    /// The ordinary ids of the current header since its last special (role, recipient,
    /// channel), and the text of its earlier parts.
    header: Vec<u32>,
    head_text: String,
    /// The function the current body is addressed to.
    recipient: Option<String>,
    /// The function a finished call addressed (`take_call`).
    called: Option<String>,
    decode: Decoder,
}

impl std::fmt::Debug for HarmonySplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarmonySplitter")
            .field("ids", &self.ids)
            .field("part", &self.part)
            .finish()
    }
}

impl HarmonySplitter {
    /// A splitter for a reply that begins after `<|start|>assistant`; `decode` turns a
    /// channel name's ids into text.
    pub fn new(ids: HarmonyIds, decode: impl Fn(&[u32]) -> String + Send + Sync + 'static) -> Self {
        HarmonySplitter {
            ids,
            part: Part::Header { in_channel: false },
            channel: Vec::new(),
            header: Vec::new(),
            head_text: String::new(),
            recipient: None,
            called: None,
            decode: Box::new(decode),
        }
    }

    /// Whether the reply has ended.
    pub fn done(&self) -> bool {
        self.part == Part::Done
    }

    /// The function of a call that `<|call|>` just ended (once).
    pub fn take_call(&mut self) -> Option<String> {
        self.called.take()
    }

    /// The channel of `id`'s text, or `None` for a format token or a header.
    pub fn push(&mut self, id: u32) -> Option<Channel> {
        let h = self.ids;
        match (&self.part, id) {
            (Part::Done, _) => None,
            (part, i) if i == h.ret || i == h.call => {
                if i == h.call && *part == Part::Body(Channel::Call) {
                    self.called = self.recipient.take();
                }
                self.part = Part::Done;
                None
            }
            (Part::Body(_), i) if i == h.end => {
                self.part = Part::Header { in_channel: false };
                self.header.clear();
                self.head_text.clear();
                self.recipient = None;
                None
            }
            (Part::Body(c), _) => Some(*c),
            (Part::Header { .. }, i) if i == h.channel => {
                self.channel.clear();
                // The text before <|channel|> (role, maybe recipient) as one word group.
                self.head_text = format!("{} ", (self.decode)(&self.header));
                self.header.clear();
                self.part = Part::Header { in_channel: true };
                None
            }
            (Part::Header { .. }, i) if i == h.message => {
                let name = (self.decode)(&self.channel);
                // The recipient may stand after the role or after the channel.
                let head = format!("{}{}", self.head_text, (self.decode)(&self.header));
                // A format marker may follow the name without a space
                // (`to=functions.f<|constrain|>json`).
                self.recipient = head
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix("to=functions."))
                    .map(|r| r.split(CONSTRAIN).next().unwrap_or(r).to_string());
                // A channel name may carry a constraint (`commentary json`).
                let c = match name.split_whitespace().next() {
                    _ if self.recipient.is_some() => Channel::Call,
                    Some("analysis") => Channel::Analysis,
                    Some("final") => Channel::Final,
                    _ => Channel::Other,
                };
                self.channel.clear();
                self.header.clear();
                self.head_text.clear();
                self.part = Part::Body(c);
                None
            }
            (Part::Header { in_channel }, i) => {
                if *in_channel {
                    self.channel.push(i);
                }
                self.header.push(i);
                None
            }
        }
    }
}

/// The UTC date (YYYY-MM-DD) of a Unix time, for `HarmonyOptions::date` (the caller reads its
/// clock; the library reads none).
pub fn civil_date(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
