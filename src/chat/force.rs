//! `tool_choice` and `parallel_tool_calls` kept by the tokens themselves, not only asked for:
//! where the reply closes its response block (`<|close|>response<|sep|>`), the forcer feeds
//! the tokens that follow from the choice (a tools section for `required`, the named call for
//! a function, the message's end for `none`), and with parallel calls off it ends the section
//! after the first call. Every other token is the chooser's. Knows the chat format's markers,
//! nothing of sampling or HTTP.

use std::collections::VecDeque;

use super::tools::ToolChoice;
use super::{close_tag, encode_segments, open_tag, Segment};
use crate::tokenizer::Tokenizer;

/// Forces the tokens that `tool_choice` and `parallel_tool_calls` imply.
#[derive(Debug)]
pub struct ToolForcer {
    /// Fed after `<|close|>response<|sep|>` (empty: nothing forced there).
    after_response: Vec<u32>,
    /// Fed after the first `<|close|>call<|sep|>` (empty: nothing forced there).
    after_call: Vec<u32>,
    close: u32,
    sep: u32,
    /// Tokens since the last `<|close|>` (None: no close yet, or a `<|sep|>` ended it).
    since_close: Option<Vec<u32>>,
    queue: VecDeque<u32>,
    fired: (bool, bool),
}

fn segs_ids(tok: &Tokenizer, f: impl FnOnce(&mut Vec<Segment>)) -> Vec<u32> {
    let mut s = Vec::new();
    f(&mut s);
    encode_segments(tok, &s)
}

impl ToolForcer {
    /// A forcer for `choice` (`None` when the choice and `parallel` force nothing, or the
    /// tokenizer lacks the chat format's special tokens).
    pub fn new(tok: &Tokenizer, choice: &ToolChoice, parallel: bool) -> Option<Self> {
        let end = |s: &mut Vec<Segment>| {
            close_tag(s, "message");
            s.push(Segment::Control("<|end_of_msg|>".into()));
        };
        let after_response = match choice {
            ToolChoice::Auto => Vec::new(),
            ToolChoice::None => segs_ids(tok, end),
            ToolChoice::Required => segs_ids(tok, |s| {
                open_tag(s, "tools", &[]);
                s.push(Segment::Control("<|open|>".into()));
                s.push(Segment::Text("call".into()));
            }),
            ToolChoice::Function(n) => segs_ids(tok, |s| {
                open_tag(s, "tools", &[]);
                open_tag(s, "call", &[("tool", n), ("index", "1")]);
            }),
        };
        let after_call = match (parallel, choice) {
            (false, c) if *c != ToolChoice::None => segs_ids(tok, |s| {
                close_tag(s, "tools");
                end(s);
            }),
            _ => Vec::new(),
        };
        if after_response.is_empty() && after_call.is_empty() {
            return None;
        }
        Some(ToolForcer {
            after_response,
            after_call,
            close: tok.special_id("<|close|>")?,
            sep: tok.special_id("<|sep|>")?,
            since_close: None,
            queue: VecDeque::new(),
            fired: (false, false),
        })
    }

    /// The next token: a forced one, else `choose()`'s.
    pub fn next(&mut self, tok: &Tokenizer, choose: impl FnOnce() -> u32) -> u32 {
        let id = self.queue.pop_front().unwrap_or_else(choose);
        self.observe(tok, id);
        id
    }

    fn observe(&mut self, tok: &Tokenizer, id: u32) {
        if id == self.close {
            self.since_close = Some(Vec::new());
            return;
        }
        let Some(inner) = self.since_close.as_mut() else {
            return;
        };
        if id != self.sep {
            inner.push(id);
            return;
        }
        let tag = tok.decode(inner);
        self.since_close = None;
        // Only what the chooser may still change is forced: a queue being fed is left alone.
        if !self.queue.is_empty() {
            return;
        }
        if tag == "response" && !self.fired.0 {
            self.fired.0 = true;
            self.queue.extend(&self.after_response);
        } else if tag == "call" && !self.fired.1 {
            self.fired.1 = true;
            self.queue.extend(&self.after_call);
        }
    }
}

/// `response_format: json_object`: the reply's response block is masked to one JSON object
/// (`JsonMask`), then closed by forced tokens; a think block before it is left free.
pub struct JsonReply {
    mask: super::JsonMask,
    open: u32,
    sep: u32,
    /// Tokens since the last `<|open|>` (None: none open).
    since_open: Option<Vec<u32>>,
    /// In the response block.
    active: bool,
    /// `<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>`.
    end: Vec<u32>,
    queue: VecDeque<u32>,
}

impl JsonReply {
    /// For a reply that opens with a think block (`thinking`) or with the response; `None`
    /// when the tokenizer lacks the chat format's special tokens.
    pub fn new(tok: &Tokenizer, mask: super::JsonMask, thinking: bool) -> Option<Self> {
        Some(JsonReply {
            mask,
            open: tok.special_id("<|open|>")?,
            sep: tok.special_id("<|sep|>")?,
            since_open: None,
            active: !thinking,
            end: segs_ids(tok, |s| {
                close_tag(s, "response");
                close_tag(s, "message");
                s.push(Segment::Control("<|end_of_msg|>".into()));
            }),
            queue: VecDeque::new(),
        })
    }

    /// The next token: forced, else `choose` on the logits (masked in the response block).
    pub fn next(
        &mut self,
        tok: &Tokenizer,
        logits: &[f32],
        choose: impl FnOnce(&[f32]) -> u32,
    ) -> u32 {
        if let Some(id) = self.queue.pop_front() {
            return id;
        }
        if !self.active {
            let id = choose(logits);
            self.observe(tok, id);
            return id;
        }
        let mut l = logits.to_vec();
        self.mask.apply(&mut l);
        let id = choose(&l);
        self.mask.advance(id);
        if self.mask.done() {
            self.queue.extend(&self.end);
        }
        id
    }

    fn observe(&mut self, tok: &Tokenizer, id: u32) {
        if id == self.open {
            self.since_open = Some(Vec::new());
        } else if id == self.sep {
            let inner = self.since_open.take().unwrap_or_default();
            self.active = tok.decode(&inner) == "response";
        } else if let Some(v) = self.since_open.as_mut() {
            v.push(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tests::fixture_tok;

    /// Runs the forcer over a scripted chooser; returns the text it let through.
    fn run(choice: ToolChoice, parallel: bool, script: &str) -> String {
        let tok = fixture_tok();
        let mut f = ToolForcer::new(&tok, &choice, parallel).unwrap();
        let eom = tok.special_id("<|end_of_msg|>").unwrap();
        let mut script: VecDeque<u32> = tok.encode(script, true).into();
        let mut out = Vec::new();
        while out.last() != Some(&eom) && out.len() < 400 {
            out.push(f.next(&tok, || script.pop_front().unwrap_or(eom)));
        }
        tok.decode(&out)
    }

    const ANSWER: &str = "Plain.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    const CALLS: &str = "ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"a\" index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"b\" index=\"2\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

    #[test]
    fn choices_force_the_tokens_they_imply() {
        assert!(ToolForcer::new(&fixture_tok(), &ToolChoice::Auto, true).is_none());
        // none: the message ends where the response closes.
        assert_eq!(
            run(ToolChoice::None, true, CALLS),
            "ok<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"
        );
        // A named function: its call opens where the response closes (the chooser goes on).
        let named = run(ToolChoice::Function("get".into()), true, ANSWER);
        assert!(
            named.starts_with("Plain.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get\" index=\"1\"<|sep|><|close|>message"),
            "{named}"
        );
        let req = run(ToolChoice::Required, true, ANSWER);
        assert!(
            req.starts_with(
                "Plain.<|close|>response<|sep|><|open|>tools<|sep|><|open|>call<|close|>message"
            ),
            "{req}"
        );
        // No parallel calls: the section ends after the first.
        assert_eq!(
            run(ToolChoice::Auto, false, CALLS),
            "ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"a\" index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"
        );
        // An answer without calls is left alone by `auto` with parallel calls off.
        assert_eq!(run(ToolChoice::Auto, false, ANSWER), ANSWER);
    }
}
