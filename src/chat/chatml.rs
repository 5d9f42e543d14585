//! ChatML, the chat format of Qwen (Qwen2, Qwen3, Qwen3-MoE) and many others:
//! `<|im_start|>{role}\n{content}<|im_end|>\n` per message, `<|im_start|>assistant\n` to open
//! the reply, and Qwen3's thinking: the reply opens with `<think>…</think>` (reasoning) before
//! its content; with thinking off the prompt closes an empty think block itself, as Qwen3's
//! template does with `enable_thinking=False`. Earlier assistant turns render their content
//! only (the template drops their reasoning), so each turn renders the whole history. A tool
//! result renders as a user turn's `<tool_response>`. Declaring tools and JSON response
//! schemas is not implemented for ChatML (refused by name). Owns the rendering, the reply
//! splitter and `ChatMl`, the format as a `ChatFormat`.

use std::sync::Arc;

use super::format::{ChatFormat, ReplySplitter};
use super::{ChatOptions, Delta, Effort, Message, Phase, Segment};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use crate::{Error, Result};

/// ChatML with Qwen3's think block: renders the whole history each turn, defaults to
/// `medium` effort, ends a reply at `<|im_end|>` or `<|endoftext|>`.
#[derive(Debug, Clone, Copy)]
pub struct ChatMl;

impl ChatFormat for ChatMl {
    fn name(&self) -> &'static str {
        "chatml"
    }

    fn render(
        &self,
        messages: &[Message],
        opts: &ChatOptions,
    ) -> Result<(Vec<Segment>, Vec<usize>)> {
        render_marked(messages, opts)
    }

    fn default_effort(&self) -> Effort {
        Effort::Medium
    }

    fn end_ids(&self, tok: &Tokenizer) -> Vec<u32> {
        end_ids(tok)
    }

    fn splitter(
        &self,
        tok: &Arc<Tokenizer>,
        _thinking: bool,
        _calls: bool,
    ) -> Result<Box<dyn ReplySplitter>> {
        Ok(Box::new(ChatMlReply::new(tok)))
    }
}

/// Opens a message.
pub const IM_START: &str = "<|im_start|>";
/// Closes a message (Qwen3's end of a reply).
pub const IM_END: &str = "<|im_end|>";
/// Ends a document (Qwen's other stop id).
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// Opens the reasoning.
pub const THINK: &str = "<think>";
/// Closes the reasoning.
pub const THINK_END: &str = "</think>";

fn message(out: &mut Vec<Segment>, role: &str, content: &str) {
    out.push(Segment::Control(IM_START.into()));
    out.push(Segment::Text(format!("{role}\n{content}")));
    out.push(Segment::Control(IM_END.into()));
    out.push(Segment::Text("\n".into()));
}

/// The conversation rendered for generation, with the segment counts after the (empty)
/// preamble and after each message.
pub fn render_marked(
    messages: &[Message],
    opts: &ChatOptions,
) -> Result<(Vec<Segment>, Vec<usize>)> {
    if opts.tools.is_some() || opts.response_schema.is_some() {
        return Err(Error::Msg(
            "ChatML (Qwen3-MoE): tools and response_format json_schema are not supported yet"
                .into(),
        ));
    }
    let mut out = Vec::new();
    let mut marks = vec![0];
    for m in messages {
        match m.role.as_str() {
            "system" | "user" | "assistant" => message(&mut out, &m.role, &m.content),
            "tool" => message(
                &mut out,
                "user",
                &format!("<tool_response>\n{}\n</tool_response>", m.content),
            ),
            other => {
                return Err(Error::Msg(format!(
                    "ChatML: a message of role `{other}` (use system, user, assistant or tool)"
                )))
            }
        }
        marks.push(out.len());
    }
    out.push(Segment::Control(IM_START.into()));
    out.push(Segment::Text("assistant\n".into()));
    if !opts.thinking {
        out.push(Segment::Control(THINK.into()));
        out.push(Segment::Text("\n\n".into()));
        out.push(Segment::Control(THINK_END.into()));
        out.push(Segment::Text("\n\n".into()));
    }
    Ok((out, marks))
}

/// The ids that end a reply: `<|im_end|>` and `<|endoftext|>`, those the vocabulary has.
pub fn end_ids(tok: &Tokenizer) -> Vec<u32> {
    [IM_END, END_OF_TEXT]
        .iter()
        .filter_map(|s| tok.special_id(s))
        .collect()
}

/// A ChatML reply: reasoning between `<think>` and `</think>`, content after, ended by
/// `<|im_end|>`; one decoder per part, so a code point split across tokens is never split
/// across parts, and the newlines the template puts around the think block are dropped.
#[derive(Debug)]
struct ChatMlReply {
    think: Option<u32>,
    think_end: Option<u32>,
    ends: Vec<u32>,
    phase: Phase,
    decoders: [StreamDecoder; 2],
    /// Whether each part has shown text yet (leading newlines are the template's).
    started: [bool; 2],
}

impl ChatMlReply {
    /// A splitter for one reply in `tok`'s vocabulary.
    fn new(tok: &Tokenizer) -> Self {
        ChatMlReply {
            think: tok.special_id(THINK),
            think_end: tok.special_id(THINK_END),
            ends: end_ids(tok),
            phase: Phase::Content,
            decoders: Default::default(),
            started: [false; 2],
        }
    }

    /// Decodes token `id` and returns the deltas now certain.
    fn push(&mut self, tok: &Tokenizer, id: u32) -> Vec<Delta> {
        if self.phase == Phase::Done {
            return Vec::new();
        }
        if Some(id) == self.think {
            let mut out = self.flush();
            self.phase = Phase::Reasoning;
            out.retain(|d| !matches!(d, Delta::Content(t) if t.trim().is_empty()));
            return out;
        }
        if Some(id) == self.think_end || self.ends.contains(&id) {
            let out = self.flush();
            self.phase = match self.ends.contains(&id) {
                true => Phase::Done,
                false => Phase::Content,
            };
            return out;
        }
        let part = usize::from(self.phase != Phase::Reasoning);
        let text = self.decoders[part].push(tok, id);
        self.emit(part, text).into_iter().collect()
    }

    /// Text of part `part` as a delta, leading newlines dropped until the part has text.
    fn emit(&mut self, part: usize, text: String) -> Option<Delta> {
        let text = match self.started[part] {
            true => text,
            false => text.trim_start_matches('\n').to_string(),
        };
        if text.is_empty() {
            return None;
        }
        self.started[part] = true;
        Some(match part {
            0 => Delta::Reasoning(text),
            _ => Delta::Content(text),
        })
    }

    /// What the decoders still hold.
    fn flush(&mut self) -> Vec<Delta> {
        let r = self.decoders[0].finish();
        let c = self.decoders[1].finish();
        [self.emit(0, r), self.emit(1, c)]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl ReplySplitter for ChatMlReply {
    fn push_id(&mut self, tok: &Tokenizer, _dec: &mut StreamDecoder, id: u32) -> Vec<Delta> {
        self.push(tok, id)
    }

    fn finish(&mut self, _dec: &mut StreamDecoder) -> Vec<Delta> {
        self.flush()
    }

    fn phase(&self) -> Phase {
        self.phase
    }

    fn done(&self) -> bool {
        self.phase == Phase::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_qwen3s_template_with_and_without_thinking() {
        let msgs = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi"),
        ];
        let text = |thinking| {
            let o = ChatOptions {
                thinking,
                ..Default::default()
            };
            super::super::segments_text(&render_marked(&msgs, &o).unwrap().0)
        };
        let head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(text(true), head);
        assert_eq!(text(false), format!("{head}<think>\n\n</think>\n\n"));
        let o = ChatOptions {
            tools: Some(serde_json::json!([])),
            ..Default::default()
        };
        assert!(render_marked(&msgs, &o).is_err());
    }
}
