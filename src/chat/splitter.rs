//! The streaming splitter: turns generated tokens into `reasoning_content` and `content` deltas,
//! stripping the structural markers and never emitting part of one. A marker counts only where
//! its special parts (`<|open|>`, `<|close|>`, `<|sep|>`, `<|end_of_msg|>`) came from special
//! token ids: an answer that spells a marker with ordinary tokens is text.

use super::tools::{parse_call, ToolCall};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A delta produced by the splitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Thinking text.
    Reasoning(String),
    /// Answer text.
    Content(String),
    /// A complete tool call from the reply's tools section.
    ToolCall(ToolCall),
}

/// A marker: its parts, each `(text, is a special token)`.
pub(super) type Marker = &'static [(&'static str, bool)];

pub(super) const THINK_CLOSE: Marker = &[("<|close|>", true), ("think", false), ("<|sep|>", true)];
pub(super) const RESP_OPEN: Marker = &[("<|open|>", true), ("response", false), ("<|sep|>", true)];
pub(super) const RESP_CLOSE: Marker = &[
    ("<|close|>", true),
    ("response", false),
    ("<|sep|>", true),
    ("<|close|>", true),
    ("message", false),
    ("<|sep|>", true),
];
pub(super) const EOM: Marker = &[("<|end_of_msg|>", true)];
/// The response closed and a tools section opened.
const TOOLS_OPEN: Marker = &[
    ("<|close|>", true),
    ("response", false),
    ("<|sep|>", true),
    ("<|open|>", true),
    ("tools", false),
    ("<|sep|>", true),
];
const TOOLS_CLOSE: Marker = &[("<|close|>", true), ("tools", false), ("<|sep|>", true)];
const CALL_OPEN: Marker = &[("<|open|>", true), ("call", false)];
const CALL_CLOSE: Marker = &[("<|close|>", true), ("call", false), ("<|sep|>", true)];

fn text(m: Marker) -> String {
    m.iter().map(|p| p.0).collect()
}

/// Where an assistant reply is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// In the think block.
    Reasoning,
    /// In the response block.
    Content,
    /// In the tools section after the response.
    Tools,
    /// The message was closed.
    Done,
}

/// Pending text with, per byte, whether it came from a special token.
#[derive(Debug, Default)]
struct Pending {
    text: String,
    special: Vec<bool>,
}

impl Pending {
    /// Whether marker `m` lies at byte `at` with its special parts special and its text parts not.
    fn is_at(&self, at: usize, m: Marker) -> bool {
        let mut o = at;
        for &(t, sp) in m {
            if !self.text[o..].starts_with(t)
                || self.special[o..o + t.len()].iter().any(|&b| b != sp)
            {
                return false;
            }
            o += t.len();
        }
        true
    }

    /// The first real occurrence of `m`.
    fn find(&self, m: Marker) -> Option<usize> {
        let t = text(m);
        self.text
            .match_indices(&t)
            .map(|(i, _)| i)
            .find(|&i| self.is_at(i, m))
    }

    /// `end` minus the marker's length when a real `m` ends exactly at `end`.
    fn marker_before(&self, end: usize, m: Marker) -> Option<usize> {
        let n = text(m).len();
        (end >= n && self.is_at(end - n, m)).then(|| end - n)
    }

    /// Splits off everything before byte `k` (the rest stays pending).
    fn take(&mut self, k: usize) -> Pending {
        let rest = Pending {
            text: self.text[k..].to_string(),
            special: self.special[k..].to_vec(),
        };
        self.text.truncate(k);
        self.special.truncate(k);
        std::mem::replace(self, rest)
    }
}

/// Splits generated text into reasoning and content, stripping the structural markers and
/// never emitting part of a marker.
#[derive(Debug)]
pub struct ChatSplitter {
    phase: Phase,
    pending: Pending,
    /// Whether a tools section is parsed into calls (else it stays content).
    tools: bool,
}

/// Length of the longest suffix of `s` that is a proper prefix of `marker`.
fn partial_suffix(s: &str, marker: &str) -> usize {
    let max = s.len().min(marker.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && marker.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

impl ChatSplitter {
    /// A splitter for a reply that starts in the think block (`thinking`) or in the response.
    pub fn new(thinking: bool) -> Self {
        ChatSplitter {
            phase: if thinking {
                Phase::Reasoning
            } else {
                Phase::Content
            },
            pending: Pending::default(),
            tools: false,
        }
    }

    /// Parses a tools section after the response into `Delta::ToolCall`s (the request declared
    /// tools and allows calls).
    pub fn with_tools(mut self, on: bool) -> Self {
        self.tools = on;
        self
    }

    /// Whether the end of the message was seen.
    pub fn done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Where the reply is now.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Feeds ordinary text (no special tokens); returns the deltas that are now certain.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.push_token(text, 0)
    }

    /// Feeds decoded text whose last `special_len` bytes are a special token's text.
    pub fn push_token(&mut self, text: &str, special_len: usize) -> Vec<Delta> {
        let ordinary = text.len().saturating_sub(special_len);
        self.pending.text.push_str(text);
        self.pending
            .special
            .extend((0..text.len()).map(|i| i >= ordinary));
        self.drain(false)
    }

    /// Decodes token `id` through `dec` and feeds it (special tokens marked as such).
    pub fn push_id(&mut self, tok: &Tokenizer, dec: &mut StreamDecoder, id: u32) -> Vec<Delta> {
        let text = dec.push(tok, id);
        let special = tok.special_text(id).map_or(0, |s| s.len());
        self.push_token(&text, special)
    }

    /// Ends the stream; returns what is left.
    pub fn finish(&mut self) -> Vec<Delta> {
        self.drain(true)
    }

    fn emit(out: &mut Vec<Delta>, phase: Phase, s: &str) {
        if s.is_empty() {
            return;
        }
        match phase {
            Phase::Reasoning => out.push(Delta::Reasoning(s.to_string())),
            Phase::Content | Phase::Tools => out.push(Delta::Content(s.to_string())),
            Phase::Done => {}
        }
    }

    /// Emits `p[..end]` in `phase`, without a real `strip` marker that ends it.
    fn emit_before(out: &mut Vec<Delta>, phase: Phase, p: &Pending, end: usize, strip: Marker) {
        let cut = p.marker_before(end, strip).unwrap_or(end);
        Self::emit(out, phase, &p.text[..cut]);
    }

    /// Bytes to hold back: a possible start of any of `markers` (by text), or a whole
    /// `structural` marker whose meaning depends on what follows.
    fn hold(p: &Pending, markers: &[String], structural: Marker) -> usize {
        let h = markers
            .iter()
            .map(|m| partial_suffix(&p.text, m))
            .max()
            .unwrap_or(0);
        match p.marker_before(p.text.len(), structural) {
            Some(_) => h.max(text(structural).len()),
            None => h,
        }
    }

    fn drain(&mut self, last: bool) -> Vec<Delta> {
        let mut out = Vec::new();
        loop {
            match self.phase {
                Phase::Done => {
                    self.pending = Pending::default();
                    return out;
                }
                Phase::Reasoning => {
                    let p = &self.pending;
                    let (open, eom) = (p.find(RESP_OPEN), p.find(EOM));
                    let cut = match (open, eom) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    if let Some(c) = cut {
                        Self::emit_before(&mut out, Phase::Reasoning, p, c, THINK_CLOSE);
                        if Some(c) == open {
                            self.phase = Phase::Content;
                            self.pending.take(c + text(RESP_OPEN).len());
                        } else {
                            self.phase = Phase::Done;
                        }
                        continue;
                    }
                    if last {
                        Self::emit_before(&mut out, Phase::Reasoning, p, p.text.len(), THINK_CLOSE);
                        self.pending = Pending::default();
                        return out;
                    }
                    // Hold back a possible `<|close|>think<|sep|><|open|>response<|sep|>` start.
                    let marks = [
                        text(THINK_CLOSE) + &text(RESP_OPEN),
                        text(RESP_OPEN),
                        text(EOM),
                    ];
                    let k = p.text.len() - Self::hold(p, &marks, THINK_CLOSE);
                    let head = self.pending.take(k);
                    Self::emit(&mut out, Phase::Reasoning, &head.text);
                    return out;
                }
                Phase::Tools => {
                    if self.drain_tools(&mut out, last) {
                        continue;
                    }
                    return out;
                }
                Phase::Content => {
                    let p = &self.pending;
                    let eom = p.find(EOM);
                    let tools = if self.tools { p.find(TOOLS_OPEN) } else { None };
                    if let Some(t) = tools.filter(|&t| eom.is_none_or(|e| t < e)) {
                        Self::emit(&mut out, Phase::Content, &p.text[..t]);
                        self.phase = Phase::Tools;
                        self.pending.take(t + text(TOOLS_OPEN).len());
                        continue;
                    }
                    if let Some(c) = eom {
                        Self::emit_before(&mut out, Phase::Content, p, c, RESP_CLOSE);
                        self.phase = Phase::Done;
                        continue;
                    }
                    if last {
                        Self::emit_before(&mut out, Phase::Content, p, p.text.len(), RESP_CLOSE);
                        self.pending = Pending::default();
                        return out;
                    }
                    // The close marker is structural only when the end of message follows, so
                    // it is held back until that is known.
                    let marks = [
                        text(RESP_CLOSE) + &text(EOM),
                        text(EOM),
                        if self.tools {
                            text(TOOLS_OPEN)
                        } else {
                            String::new()
                        },
                    ];
                    let k = p.text.len() - Self::hold(p, &marks, RESP_CLOSE);
                    let head = self.pending.take(k);
                    Self::emit(&mut out, Phase::Content, &head.text);
                    return out;
                }
            }
        }
    }

    /// One step in the tools section: a complete call becomes a `ToolCall` (a malformed one,
    /// its raw text as content), the section's close ends the reply, anything else is content.
    /// Returns whether it made progress (else it waits for more text).
    fn drain_tools(&mut self, out: &mut Vec<Delta>, last: bool) -> bool {
        let p = &self.pending;
        let lead = p.text.len() - p.text.trim_start_matches(|c: char| c.is_whitespace()).len();
        let lead = (0..lead).find(|&i| p.special[i]).unwrap_or(lead);
        if lead == p.text.len() {
            if last {
                self.pending = Pending::default();
            }
            return false;
        }
        if p.is_at(lead, TOOLS_CLOSE) {
            self.phase = Phase::Done;
            return true;
        }
        let eom = p.find(EOM);
        if p.is_at(lead, CALL_OPEN) {
            let close = p.text[lead..]
                .match_indices(&text(CALL_CLOSE))
                .map(|(i, _)| lead + i)
                .find(|&i| p.is_at(i, CALL_CLOSE))
                .filter(|&c| eom.is_none_or(|e| c < e));
            if let Some(c) = close {
                let end = c + text(CALL_CLOSE).len();
                match parse_call(&p.text[lead..end], &p.special[lead..end]) {
                    Some(call) => out.push(Delta::ToolCall(call)),
                    None => Self::emit(out, Phase::Tools, &p.text[lead..end]),
                }
                self.pending.take(end);
                return true;
            }
        }
        if let Some(e) = eom {
            Self::emit(out, Phase::Tools, &p.text[lead..e]);
            self.phase = Phase::Done;
            return true;
        }
        if last {
            Self::emit(out, Phase::Tools, &p.text[lead..]);
            self.pending = Pending::default();
            return false;
        }
        false
    }
}
