//! The chat-format contract (`ChatFormat`) a model's family supplies, and the reply splitter
//! (`ReplySplitter`) it builds: a conversation to token ids with its cut points, the ids that
//! close a reply cut short and open the next turn, and the split of generated ids into
//! reasoning, content and tool-call deltas. The session, the server and the CLI hold a
//! `&'static dyn ChatFormat` and call only this. Owns the contract and K3's XTML (`Xtml`, the
//! format the tool forcing and JSON masks steer); harmony is `harmony_format.rs`, ChatML
//! `chatml.rs`, and a family with a format of its own implements the trait in its folder.

use std::sync::Arc;

use super::{
    close_turn, encode_segments, render_continuation, render_marked, ChatOptions, ChatSplitter,
    Delta, Effort, Message, Phase, Segment,
};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

/// A chat format: how a conversation is rendered for a model and how its replies are read.
pub trait ChatFormat: Send + Sync + std::fmt::Debug {
    /// The format's name, for messages and reports.
    fn name(&self) -> &'static str;

    /// The whole conversation rendered for generation, with the segment counts after the
    /// preamble and after each message (where a later request may diverge; `encode_marked`
    /// turns both into ids and positions).
    fn render(
        &self,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<(Vec<Segment>, Vec<usize>)>;

    /// The reasoning effort when neither the request nor the caller names one.
    fn default_effort(&self) -> Effort;

    /// Refuses an effort the format cannot render.
    fn check_effort(&self, _effort: Effort) -> Result<()> {
        Ok(())
    }

    /// The reasoning effort a conversation renders with: the request's, else the caller's
    /// default (the binaries: `K3_REASONING_EFFORT`), else the format's own.
    fn effort(&self, request: Option<&str>, default: Option<&str>) -> Result<Effort> {
        let e = match (request, default) {
            (Some(r), _) => Effort::parse(r)?,
            (None, Some(d)) if !d.is_empty() => Effort::parse(d)?,
            _ => self.default_effort(),
        };
        self.check_effort(e)?;
        Ok(e)
    }

    /// Whether a session may feed only a new turn after a reply (`continuation`). A template
    /// that drops earlier turns' reasoning never matches the held state, so it renders the
    /// whole history each turn instead (the default).
    fn continues(&self) -> bool {
        false
    }

    /// The ids that close a reply left in `phase` (unless it ended with `end_id`, still
    /// pending) and open a turn with `messages` (only where `continues`).
    fn continuation(
        &self,
        _tok: &Tokenizer,
        _pending: Option<u32>,
        _end_id: u32,
        _phase: Phase,
        _messages: &[Message],
        _opts: &ChatOptions,
    ) -> Result<Vec<u32>> {
        Err(Error::Msg(format!(
            "the {} chat format re-renders the history every turn",
            self.name()
        )))
    }

    /// The ids that end a reply in this format besides the model's own stop ids (none when
    /// the vocabulary lacks them).
    fn end_ids(&self, _tok: &Tokenizer) -> Vec<u32> {
        Vec::new()
    }

    /// A splitter for one reply (`thinking`: the reply opens in its reasoning; `calls`: a
    /// tools section is returned as calls). Fails when the vocabulary lacks the format's
    /// specials.
    fn splitter(
        &self,
        tok: &Arc<Tokenizer>,
        thinking: bool,
        calls: bool,
    ) -> Result<Box<dyn ReplySplitter>>;

    /// Whether a reply can be steered token by token in this format: a forced tool call
    /// (`tool_choice` required or a named function) and JSON masks (`response_format`).
    fn steers_replies(&self) -> bool {
        false
    }
}

/// Splits one reply, id by id, into reasoning, content and tool-call deltas.
pub trait ReplySplitter: Send + std::fmt::Debug {
    /// Decodes token `id` (through `dec` where the format decodes one stream) and returns the
    /// deltas now certain.
    fn push_id(&mut self, tok: &Tokenizer, dec: &mut StreamDecoder, id: u32) -> Vec<Delta>;

    /// Ends the stream; returns what is left.
    fn finish(&mut self, dec: &mut StreamDecoder) -> Vec<Delta>;

    /// Where the reply stands (reasoning, content, a tool section, done).
    fn phase(&self) -> Phase;

    /// Whether the reply has ended.
    fn done(&self) -> bool;
}

/// Kimi K3's XTML (`<|open|>message role="…"<|sep|>…`): continues turns, steers replies,
/// refuses `medium` effort, defaults to `max`.
#[derive(Debug, Clone, Copy)]
pub struct Xtml;

impl ChatFormat for Xtml {
    fn name(&self) -> &'static str {
        "xtml"
    }

    fn render(
        &self,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<(Vec<Segment>, Vec<usize>)> {
        render_marked(messages, opts)
    }

    fn default_effort(&self) -> Effort {
        Effort::Max
    }

    fn check_effort(&self, effort: Effort) -> Result<()> {
        if effort == Effort::Medium {
            return Err(Error::Msg(super::MEDIUM_REFUSED.into()));
        }
        Ok(())
    }

    fn continues(&self) -> bool {
        true
    }

    fn continuation(
        &self,
        tok: &Tokenizer,
        pending: Option<u32>,
        end_id: u32,
        phase: Phase,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<Vec<u32>> {
        let mut segs = Vec::new();
        if pending != Some(end_id) {
            segs = close_turn(phase);
        }
        segs.extend(render_continuation(messages, opts)?);
        Ok(encode_segments(tok, &segs))
    }

    fn splitter(
        &self,
        _tok: &Arc<Tokenizer>,
        thinking: bool,
        calls: bool,
    ) -> Result<Box<dyn ReplySplitter>> {
        Ok(Xtml::reply(thinking, calls))
    }

    fn steers_replies(&self) -> bool {
        true
    }
}

impl Xtml {
    /// A splitter for one XTML reply (it needs no specials, so it cannot fail).
    pub fn reply(thinking: bool, calls: bool) -> Box<dyn ReplySplitter> {
        Box::new(XtmlReply(ChatSplitter::new(thinking).with_tools(calls)))
    }
}

/// An XTML reply: the text splitter over one stream decoder.
#[derive(Debug)]
struct XtmlReply(ChatSplitter);

impl ReplySplitter for XtmlReply {
    fn push_id(&mut self, tok: &Tokenizer, dec: &mut StreamDecoder, id: u32) -> Vec<Delta> {
        self.0.push_id(tok, dec, id)
    }

    fn finish(&mut self, dec: &mut StreamDecoder) -> Vec<Delta> {
        let mut rest = self.0.push(&dec.finish());
        rest.extend(self.0.finish());
        rest
    }

    fn phase(&self) -> Phase {
        self.0.phase()
    }

    fn done(&self) -> bool {
        self.0.done()
    }
}
