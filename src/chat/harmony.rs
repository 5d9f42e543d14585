//! OpenAI's harmony chat format (gpt-oss): rendering a conversation to segments, and splitting a
//! reply into reasoning and content on token ids. Rendering, as the published chat template
//! lays it out: a system block (identity, knowledge cutoff, the caller's date, reasoning
//! effort, the valid channels), a developer block holding the first system/developer message
//! under `# Instructions`, user turns, earlier assistant turns as `final`-channel messages (their
//! reasoning dropped), and `<|start|>assistant` to generate. A reply is
//! `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`:
//! the splitter reads headers (role, channel) between `<|start|>`/`<|channel|>` and
//! `<|message|>`, bodies up to `<|end|>`, `<|return|>` or `<|call|>`, never matching text.
//! Tools in harmony's TypeScript form are not rendered yet (refused by name). Owns the format;
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
}

impl Default for HarmonyOptions {
    fn default() -> Self {
        HarmonyOptions {
            date: "2026-01-01".into(),
            reasoning: Reasoning::Medium,
            identity: "You are ChatGPT, a large language model trained by OpenAI.".into(),
        }
    }
}

fn control(out: &mut Vec<Segment>, s: &str) {
    out.push(Segment::Control(s.into()));
}

fn text(out: &mut Vec<Segment>, s: &str) {
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
    let system = format!(
        "{}\nKnowledge cutoff: 2024-06\nCurrent date: {}\n\nReasoning: {}\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.",
        opts.identity,
        opts.date,
        opts.reasoning.name()
    );
    message(&mut out, &[("system", false)], &system, END);
    let (developer, rest) = match messages.first() {
        Some(m) if m.role == "system" || m.role == "developer" => (Some(m), &messages[1..]),
        _ => (None, messages),
    };
    if let Some(d) = developer.filter(|d| !d.content.is_empty()) {
        let body = format!("# Instructions\n\n{}\n\n", d.content);
        message(&mut out, &[("developer", false)], &body, END);
    }
    let mut marks = vec![out.len()];
    for m in rest {
        match m.role.as_str() {
            "user" => message(&mut out, &[("user", false)], &m.content, END),
            "assistant" if !m.tool_calls.is_empty() => {
                return Err(Error::Msg(
                    "gpt-oss: assistant tool calls are not rendered yet (harmony's tool form)"
                        .into(),
                ))
            }
            // Earlier turns keep only their final answer (the template drops reasoning).
            "assistant" => message(
                &mut out,
                &[("assistant", false), (CHANNEL, true), ("final", false)],
                &m.content,
                END,
            ),
            other => {
                return Err(Error::Msg(format!(
                    "gpt-oss: a `{other}` message here is not supported (system/developer first, then user and assistant)"
                )))
            }
        }
        marks.push(out.len());
    }
    control(&mut out, START);
    text(&mut out, "assistant");
    Ok((out, marks))
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
    /// `commentary` (tool preambles and calls), or a channel the model made up.
    Other,
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
            decode: Box::new(decode),
        }
    }

    /// Whether the reply has ended.
    pub fn done(&self) -> bool {
        self.part == Part::Done
    }

    /// The channel of `id`'s text, or `None` for a format token or a header.
    pub fn push(&mut self, id: u32) -> Option<Channel> {
        let h = self.ids;
        match (&self.part, id) {
            (Part::Done, _) => None,
            (_, i) if i == h.ret || i == h.call => {
                self.part = Part::Done;
                None
            }
            (Part::Body(_), i) if i == h.end => {
                self.part = Part::Header { in_channel: false };
                None
            }
            (Part::Body(c), _) => Some(*c),
            (Part::Header { .. }, i) if i == h.channel => {
                self.channel.clear();
                self.part = Part::Header { in_channel: true };
                None
            }
            (Part::Header { .. }, i) if i == h.message => {
                let name = (self.decode)(&self.channel);
                // A channel name may carry a constraint (`commentary json`).
                let c = match name.split_whitespace().next() {
                    Some("analysis") => Channel::Analysis,
                    Some("final") => Channel::Final,
                    _ => Channel::Other,
                };
                self.channel.clear();
                self.part = Part::Body(c);
                None
            }
            (Part::Header { in_channel }, i) => {
                if *in_channel {
                    self.channel.push(i);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(segs: &[Segment]) -> String {
        segs.iter()
            .map(|s| match s {
                Segment::Control(t) | Segment::Text(t) => t.as_str(),
            })
            .collect()
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(951_782_400), "2000-02-29");
        assert_eq!(civil_date(1_796_428_799), "2026-12-04");
        assert_eq!(civil_date(1_796_428_800), "2026-12-05");
    }

    #[test]
    fn renders_the_published_layout() {
        let msgs = vec![
            Message::new("system", "Answer briefly."),
            Message::new("user", "Hi"),
            Message {
                reasoning_content: Some("dropped".into()),
                ..Message::new("assistant", "Hello!")
            },
            Message::new("user", "2+2?"),
        ];
        let opts = HarmonyOptions {
            date: "2026-12-04".into(),
            reasoning: Reasoning::High,
            ..Default::default()
        };
        let want = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2026-12-04\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>\
<|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n<|end|>\
<|start|>user<|message|>Hi<|end|>\
<|start|>assistant<|channel|>final<|message|>Hello!<|end|>\
<|start|>user<|message|>2+2?<|end|>\
<|start|>assistant";
        let segs = render(&msgs, &opts).unwrap();
        assert_eq!(flat(&segs), want);
        // Specials are control segments; user text never is.
        assert!(segs
            .iter()
            .any(|s| matches!(s, Segment::Text(t) if t == "2+2?")));
        assert!(segs
            .iter()
            .filter(|s| matches!(s, Segment::Control(_)))
            .all(|s| matches!(s, Segment::Control(t) if t.starts_with("<|"))));
        // No system message: no developer block.
        let plain = flat(&render(&msgs[1..2], &opts).unwrap());
        assert!(!plain.contains("developer"));
        assert!(render(&[Message::new("tool", "x")], &opts).is_err());
    }

    #[test]
    fn splits_channels_on_ids() {
        // 1..=6 the specials, 10 "analysis", 11 "final", 12 "commentary", 20+ text.
        let ids = HarmonyIds {
            start: 1,
            message: 2,
            end: 3,
            channel: 4,
            ret: 5,
            call: 6,
        };
        let names = |v: &[u32]| {
            v.iter()
                .map(|i| match i {
                    10 => "analysis",
                    11 => "final",
                    12 => "commentary",
                    _ => "?",
                })
                .collect::<Vec<_>>()
                .join("")
        };
        let mut s = HarmonySplitter::new(ids, names);
        let reply = [4, 10, 2, 20, 21, 3, 1, 30, 4, 11, 2, 22, 23, 5, 24];
        let got: Vec<Option<Channel>> = reply.iter().map(|&i| s.push(i)).collect();
        use Channel::*;
        assert_eq!(
            got,
            [
                None,
                None,
                None,
                Some(Analysis),
                Some(Analysis),
                None,
                None,
                None,
                None,
                None,
                None,
                Some(Final),
                Some(Final),
                None,
                None
            ]
        );
        assert!(s.done());
        // An unknown channel's body is neither reasoning nor the answer.
        let mut s = HarmonySplitter::new(ids, names);
        for i in [4, 12, 2] {
            s.push(i);
        }
        assert_eq!(s.push(40), Some(Other));
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
