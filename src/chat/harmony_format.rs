//! OpenAI's harmony (gpt-oss) as a `ChatFormat`: the request's options mapped to harmony's
//! (effort, tools, date), its specials looked up in the vocabulary, and the reply read by
//! channel (analysis is reasoning, final is content, a commentary call is a tool call). Owns
//! that mapping and the reply; the rendering and the channel parser are `harmony.rs`.

use std::sync::Arc;

use super::format::ChatFormat;
use super::harmony::{self, Channel, HarmonyIds, HarmonyOptions, HarmonySplitter, Reasoning};
use super::{
    ChatOptions, Delta, Effort, Message, Phase, ReplySplitter, Segment, ToolCall, ToolChoice,
};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

/// OpenAI's harmony: renders the whole history each turn, defaults to `medium` effort (`max`
/// renders as `high`), ends a reply at `<|return|>` or `<|call|>`.
#[derive(Debug, Clone, Copy)]
pub struct Harmony;

impl ChatFormat for Harmony {
    fn name(&self) -> &'static str {
        "harmony"
    }

    fn render(
        &self,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<(Vec<Segment>, Vec<usize>)> {
        if opts.response_schema.is_some() {
            return Err(Error::Msg(
                "harmony (gpt-oss): response_format json_schema is not supported yet".into(),
            ));
        }
        harmony::render_marked(messages, &harmony_options(opts))
    }

    fn default_effort(&self) -> Effort {
        Effort::Medium
    }

    fn end_ids(&self, tok: &Tokenizer) -> Vec<u32> {
        harmony_ids(tok).map_or(Vec::new(), |h| vec![h.ret, h.call])
    }

    fn splitter(
        &self,
        tok: &Arc<Tokenizer>,
        _thinking: bool,
        calls: bool,
    ) -> Result<Box<dyn ReplySplitter>> {
        let ids = harmony_ids(tok)?;
        let t = tok.clone();
        Ok(Box::new(HarmonyReply {
            split: HarmonySplitter::new(ids, move |i: &[u32]| t.decode(i)),
            decoders: Default::default(),
            last: None,
            calls,
            call_body: Vec::new(),
        }))
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
struct HarmonyReply {
    split: HarmonySplitter,
    decoders: [StreamDecoder; 2],
    last: Option<Channel>,
    /// Calls are returned as calls (tools declared and not `tool_choice: none`).
    calls: bool,
    call_body: Vec<u32>,
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

impl ReplySplitter for HarmonyReply {
    fn push_id(&mut self, tok: &Tokenizer, _dec: &mut StreamDecoder, id: u32) -> Vec<Delta> {
        let c = self.split.push(id);
        let mut out = Vec::new();
        if c != self.last {
            out.extend(self.flush());
            self.last = c;
        }
        match c {
            Some(Channel::Analysis) => out.push(Delta::Reasoning(self.decoders[0].push(tok, id))),
            Some(Channel::Final) => out.push(Delta::Content(self.decoders[1].push(tok, id))),
            Some(Channel::Call) => self.call_body.push(id),
            _ => {}
        }
        if let Some(name) = self.split.take_call() {
            let arguments = tok.decode(&std::mem::take(&mut self.call_body));
            if self.calls {
                out.push(Delta::ToolCall(ToolCall {
                    id: String::new(),
                    name,
                    arguments: arguments.trim().to_string(),
                }));
            }
        }
        out.retain(|d| !matches!(d, Delta::Reasoning(t) | Delta::Content(t) if t.is_empty()));
        out
    }

    fn finish(&mut self, _dec: &mut StreamDecoder) -> Vec<Delta> {
        self.flush()
    }

    /// `Done` once it returned, else the open channel's phase.
    fn phase(&self) -> Phase {
        if self.split.done() {
            return Phase::Done;
        }
        match self.last {
            Some(Channel::Analysis) => Phase::Reasoning,
            _ => Phase::Content,
        }
    }

    fn done(&self) -> bool {
        self.split.done()
    }
}
