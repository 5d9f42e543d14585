//! The chat formats a model may speak (`ChatFormat`: K3's XTML, gpt-oss's harmony, ChatML) behind one
//! face for the session and the server: a conversation to token ids with its cut points, the
//! ids that close a reply cut short and open the next turn, and a reply splitter that turns
//! generated ids into reasoning, content and tool-call deltas. Owns the dispatch between the
//! formats; the formats themselves live in `chat.rs` (XTML), `harmony.rs` and `chatml.rs`.

use std::sync::Arc;

use super::chatml::{self, ChatMlReply};
use super::harmony::{self, Channel, HarmonyIds, HarmonyOptions, HarmonySplitter, Reasoning};
use super::{
    close_turn, encode_segments, render_continuation, render_marked, ChatOptions, ChatSplitter,
    Delta, Effort, Message, Phase, Segment, ToolCall, ToolChoice,
};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

/// A chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// Kimi K3's XTML (`<|open|>message role="…"<|sep|>…`).
    Xtml,
    /// OpenAI's harmony (gpt-oss).
    Harmony,
    /// ChatML with Qwen3's think block (Qwen3-MoE).
    ChatMl,
}

impl ChatFormat {
    /// The whole conversation rendered for generation, with the segment counts after the
    /// preamble and after each message (where a later request may diverge; `encode_marked`
    /// turns both into ids and positions).
    pub fn render(
        self,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<(Vec<Segment>, Vec<usize>)> {
        match self {
            ChatFormat::Xtml => render_marked(messages, opts),
            ChatFormat::Harmony => {
                if opts.response_schema.is_some() {
                    return Err(Error::Msg(
                        "harmony (gpt-oss): response_format json_schema is not supported yet"
                            .into(),
                    ));
                }
                harmony::render_marked(messages, &harmony_options(opts))
            }
            ChatFormat::ChatMl => chatml::render_marked(messages, opts),
        }
    }

    /// The reasoning effort a conversation renders with: the request's, else the caller's
    /// default (the binaries: `K3_REASONING_EFFORT`), else the format's own (XTML max,
    /// harmony medium). XTML refuses `medium`; harmony renders `max` as `high`.
    pub fn effort(self, request: Option<&str>, default: Option<&str>) -> Result<Effort> {
        let e = match (request, default) {
            (Some(r), _) => Effort::parse(r)?,
            (None, Some(d)) if !d.is_empty() => Effort::parse(d)?,
            _ => match self {
                ChatFormat::Xtml => Effort::Max,
                ChatFormat::Harmony | ChatFormat::ChatMl => Effort::Medium,
            },
        };
        if self == ChatFormat::Xtml && e == Effort::Medium {
            return Err(Error::Msg(super::MEDIUM_REFUSED.into()));
        }
        Ok(e)
    }

    /// Whether a session may feed only a new turn after a reply (`continuation`). Harmony's
    /// and ChatML's templates drop earlier turns' reasoning, so the held state never matches a re-rendering:
    /// each turn renders the whole history instead.
    pub fn continues(self) -> bool {
        self == ChatFormat::Xtml
    }

    /// The ids that close a reply left in `phase` (unless it ended with `end_id`, still
    /// pending) and open a turn with `messages` (XTML only: see `continues`).
    pub fn continuation(
        self,
        tok: &Tokenizer,
        pending: Option<u32>,
        end_id: u32,
        phase: Phase,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<Vec<u32>> {
        if !self.continues() {
            return Err(Error::Msg(
                "this chat format re-renders the history every turn".into(),
            ));
        }
        let mut segs = Vec::new();
        if pending != Some(end_id) {
            segs = close_turn(phase);
        }
        segs.extend(render_continuation(messages, opts)?);
        Ok(encode_segments(tok, &segs))
    }

    /// The ids that end a reply in this format besides the model's own stop ids (harmony:
    /// `<|return|>` and `<|call|>`; none when the vocabulary lacks them).
    pub fn end_ids(self, tok: &Tokenizer) -> Vec<u32> {
        match self {
            ChatFormat::Xtml => Vec::new(),
            ChatFormat::Harmony => harmony_ids(tok).map_or(Vec::new(), |h| vec![h.ret, h.call]),
            ChatFormat::ChatMl => chatml::end_ids(tok),
        }
    }

    /// A splitter for one reply (`thinking`: the reply opens in its reasoning; `calls`: a
    /// tools section is returned as calls).
    pub fn splitter(
        self,
        tok: &Arc<Tokenizer>,
        thinking: bool,
        calls: bool,
    ) -> Result<ReplySplitter> {
        Ok(match self {
            ChatFormat::Xtml => ReplySplitter::Xtml(ChatSplitter::new(thinking).with_tools(calls)),
            ChatFormat::Harmony => {
                let ids = harmony_ids(tok)?;
                let t = tok.clone();
                ReplySplitter::Harmony(Box::new(HarmonyReply {
                    split: HarmonySplitter::new(ids, move |i: &[u32]| t.decode(i)),
                    decoders: Default::default(),
                    last: None,
                    calls,
                    call_body: Vec::new(),
                }))
            }
            ChatFormat::ChatMl => ReplySplitter::ChatMl(Box::new(ChatMlReply::new(tok))),
        })
    }
}

/// gpt-oss's options from the request's: effort low/medium/high map to harmony's, max to
/// high, none to harmony's default (medium).
fn harmony_options(opts: &ChatOptions) -> HarmonyOptions {
    let mut h = HarmonyOptions {
        // `tool_choice: none` declares nothing (the model is not told of the tools).
        tools: opts
            .tools
            .clone()
            .filter(|_| opts.tool_choice != ToolChoice::None),
        reasoning: match opts.effort {
            Some(Effort::Low) => Reasoning::Low,
            Some(Effort::High | Effort::Max) => Reasoning::High,
            Some(Effort::Medium) | None => Reasoning::Medium,
        },
        ..Default::default()
    };
    if let Some(d) = &opts.date {
        h.date = d.clone();
    }
    h
}

/// Harmony's special ids in `tok`'s vocabulary.
pub fn harmony_ids(tok: &Tokenizer) -> Result<HarmonyIds> {
    let id = |s: &str| {
        tok.special_id(s).ok_or_else(|| {
            Error::Msg(format!(
                "harmony's `{s}` is not a special token of this tokenizer"
            ))
        })
    };
    Ok(HarmonyIds {
        start: id(harmony::START)?,
        message: id(harmony::MESSAGE)?,
        end: id(harmony::END)?,
        channel: id(harmony::CHANNEL)?,
        ret: id(harmony::RETURN)?,
        call: id(harmony::CALL)?,
    })
}

/// A harmony reply: the channel of each id, and one decoder per channel so a code point split
/// across tokens is never split across channels; a call's arguments are collected until
/// `<|call|>` ends them.
#[derive(Debug)]
pub struct HarmonyReply {
    split: HarmonySplitter,
    decoders: [StreamDecoder; 2],
    last: Option<Channel>,
    /// Calls are returned as calls (tools declared and not `tool_choice: none`).
    calls: bool,
    call_body: Vec<u32>,
}

/// Splits a reply in its format into deltas.
#[derive(Debug)]
pub enum ReplySplitter {
    /// XTML's splitter.
    Xtml(ChatSplitter),
    /// Harmony's channels: analysis is reasoning, final is content, other channels are dropped.
    Harmony(Box<HarmonyReply>),
    /// ChatML's think block is reasoning, the rest content.
    ChatMl(Box<ChatMlReply>),
}

impl ReplySplitter {
    /// Decodes token `id` (XTML through `dec`) and returns the deltas now certain.
    pub fn push_id(&mut self, tok: &Tokenizer, dec: &mut StreamDecoder, id: u32) -> Vec<Delta> {
        match self {
            ReplySplitter::Xtml(s) => s.push_id(tok, dec, id),
            ReplySplitter::Harmony(h) => {
                let c = h.split.push(id);
                let mut out = Vec::new();
                if c != h.last {
                    out.extend(h.flush());
                    h.last = c;
                }
                match c {
                    Some(Channel::Analysis) => {
                        out.push(Delta::Reasoning(h.decoders[0].push(tok, id)))
                    }
                    Some(Channel::Final) => out.push(Delta::Content(h.decoders[1].push(tok, id))),
                    Some(Channel::Call) => h.call_body.push(id),
                    _ => {}
                }
                if let Some(name) = h.split.take_call() {
                    let arguments = tok.decode(&std::mem::take(&mut h.call_body));
                    if h.calls {
                        out.push(Delta::ToolCall(ToolCall {
                            id: String::new(),
                            name,
                            arguments: arguments.trim().to_string(),
                        }));
                    }
                }
                out.retain(
                    |d| !matches!(d, Delta::Reasoning(t) | Delta::Content(t) if t.is_empty()),
                );
                out
            }
            ReplySplitter::ChatMl(c) => c.push_id(tok, id),
        }
    }

    /// Ends the stream; returns what is left.
    pub fn finish(&mut self, dec: &mut StreamDecoder) -> Vec<Delta> {
        match self {
            ReplySplitter::Xtml(s) => {
                let mut rest = s.push(&dec.finish());
                rest.extend(s.finish());
                rest
            }
            ReplySplitter::Harmony(h) => h.flush(),
            ReplySplitter::ChatMl(c) => c.flush(),
        }
    }

    /// Where the reply ended (harmony: `Done` once it returned, else the open channel's).
    pub fn phase(&self) -> Phase {
        match self {
            ReplySplitter::Xtml(s) => s.phase(),
            ReplySplitter::Harmony(h) if h.split.done() => Phase::Done,
            ReplySplitter::Harmony(h) => match h.last {
                Some(Channel::Analysis) => Phase::Reasoning,
                _ => Phase::Content,
            },
            ReplySplitter::ChatMl(c) => c.phase(),
        }
    }

    /// Whether the reply has ended.
    pub fn done(&self) -> bool {
        match self {
            ReplySplitter::Xtml(s) => s.done(),
            ReplySplitter::Harmony(h) => h.split.done(),
            ReplySplitter::ChatMl(c) => c.phase() == Phase::Done,
        }
    }
}

impl HarmonyReply {
    /// What the channel decoders still hold.
    fn flush(&mut self) -> Vec<Delta> {
        let (r, c) = (self.decoders[0].finish(), self.decoders[1].finish());
        let mut out = Vec::new();
        if !r.is_empty() {
            out.push(Delta::Reasoning(r));
        }
        if !c.is_empty() {
            out.push(Delta::Content(c));
        }
        out
    }
}
