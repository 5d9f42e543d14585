//! `tool_choice` and `parallel_tool_calls` kept by the tokens themselves, not only asked for:
//! where the reply closes its response block (`<|close|>response<|sep|>`), the forcer feeds
//! the tokens that follow from the choice (a tools section for `required`, the named call for
//! a function, the message's end for `none`), and with parallel calls off it ends the section
//! after the first call. Every other token is the chooser's. Knows the chat format's markers,
//! nothing of sampling or HTTP.
//!
//! A call that `required` or a named function demands must come even when the reply would not
//! reach the end of its response block: until the call is forced, a `<|close|>` the chooser
//! picks can only close the block the reply is in (the think block, then the response, as the
//! format orders them), and an end of message picked there, or a token budget down to what the
//! call needs, closes the blocks itself. So a reply that thinks until it runs out of tokens, or
//! ends without a response, still yields its call.

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
    /// The reply is in its think block (else in its response, until the call is forced).
    thinking: bool,
    /// Steer the blocks to the call: `required` or a named function.
    must_call: bool,
    /// Fed after a `<|close|>` picked in the think block: `think<|sep|><|open|>response<|sep|>`.
    think_tail: Vec<u32>,
    /// Fed after a `<|close|>` picked in the response: `response<|sep|>`.
    response_tail: Vec<u32>,
    /// Tokens the reply may still emit (set by `bound`).
    left: Option<usize>,
    /// Tokens kept for the forced call's arguments (set by `bound`).
    arguments: usize,
    /// Ids that end the reply: `<|end_of_msg|>`, and the engine's stop ids (set by `bound`).
    stops: Vec<u32>,
}

/// Tokens kept for a forced call's arguments when the budget closes the blocks (at most a
/// quarter of the reply's budget).
const ARGUMENT_RESERVE: usize = 128;

/// The ids of the segments `f` pushes (a format's markers and text, encoded as one run).
pub(super) fn segs_ids(tok: &Tokenizer, f: impl FnOnce(&mut Vec<Segment>)) -> Vec<u32> {
    let mut s = Vec::new();
    f(&mut s);
    encode_segments(tok, &s)
}

impl ToolForcer {
    /// A forcer for `choice` on a reply that opens with a think block (`thinking`) or with its
    /// response (`None` when the choice and `parallel` force nothing, or the tokenizer lacks
    /// the chat format's special tokens).
    pub fn new(
        tok: &Tokenizer,
        choice: &ToolChoice,
        parallel: bool,
        thinking: bool,
    ) -> Option<Self> {
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
            thinking,
            must_call: matches!(choice, ToolChoice::Required | ToolChoice::Function(_)),
            think_tail: segs_ids(tok, |s| {
                s.push(Segment::Text("think".into()));
                s.push(Segment::Control("<|sep|>".into()));
                open_tag(s, "response", &[]);
            }),
            response_tail: segs_ids(tok, |s| {
                s.push(Segment::Text("response".into()));
                s.push(Segment::Control("<|sep|>".into()));
            }),
            left: None,
            arguments: 0,
            stops: tok.special_id("<|end_of_msg|>").into_iter().collect(),
        })
    }

    /// Tells the forcer the reply's token budget and the ids that end it, so a demanded call
    /// is forced while it still fits.
    pub fn bound(&mut self, max_new: usize, stops: &[u32]) {
        self.left = Some(max_new);
        self.arguments = ARGUMENT_RESERVE.min(max_new / 4);
        self.stops.extend_from_slice(stops);
    }

    /// The next token: a forced one, else `choose()`'s.
    pub fn next(&mut self, tok: &Tokenizer, choose: impl FnOnce() -> u32) -> u32 {
        let id = match self.queue.pop_front() {
            Some(id) => id,
            None if self.steering() && self.out_of_budget() => self.close_blocks(),
            None => {
                let id = choose();
                if !self.steering() {
                    id
                } else if self.stops.contains(&id) {
                    self.close_blocks()
                } else {
                    if id == self.close {
                        let tail = if self.thinking {
                            &self.think_tail
                        } else {
                            &self.response_tail
                        };
                        self.queue.extend(tail);
                    }
                    id
                }
            }
        };
        self.left = self.left.map(|n| n.saturating_sub(1));
        self.observe(tok, id);
        id
    }

    /// A demanded call is not yet forced and the chooser is not inside a closing tag.
    fn steering(&self) -> bool {
        self.must_call && !self.fired.0 && self.since_close.is_none()
    }

    /// What is left of the budget is what closing the blocks and the call need.
    fn out_of_budget(&self) -> bool {
        let Some(left) = self.left else { return false };
        let route = 1 + self.response_tail.len() + self.after_response.len();
        let think = if self.thinking {
            1 + self.think_tail.len()
        } else {
            0
        };
        left <= route + think + self.arguments
    }

    /// Queues the tokens that close the think block (if open) and the response, returning the
    /// first; the call follows when the response's closing `<|sep|>` is observed.
    fn close_blocks(&mut self) -> u32 {
        if self.thinking {
            self.queue.extend(self.think_tail.clone());
            self.queue.push_back(self.close);
        }
        self.queue.extend(self.response_tail.clone());
        self.close
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
        if tag == "think" {
            self.thinking = false;
        }
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

/// A scripted reply standing in for the model's choices (the server's test hook): like a
/// model, it writes on from forced tokens, so those that follow its own pick and that it holds
/// too are not written twice.
#[derive(Debug, Default)]
pub struct Script {
    ids: VecDeque<u32>,
    follows: bool,
}

impl Script {
    /// A script of `ids`.
    pub fn new(ids: Vec<u32>) -> Self {
        Script {
            ids: ids.into(),
            follows: false,
        }
    }

    /// The script's next choice (`None` once it is spent).
    pub fn pick(&mut self) -> Option<u32> {
        self.ids.pop_front()
    }

    /// Tells the script the token emitted, and whether it was its own pick.
    pub fn saw(&mut self, id: u32, chosen: bool) {
        if chosen {
            self.follows = true;
        } else if self.follows && self.ids.front() == Some(&id) {
            self.ids.pop_front();
        } else {
            self.follows = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::tests::fixture_tok;

    /// Runs the forcer over a scripted chooser; returns the text it let through.
    fn run(choice: ToolChoice, parallel: bool, script: &str) -> String {
        run_reply(choice, parallel, false, script, None)
    }

    /// `run` on a reply that may open with a think block, within an optional token budget (a
    /// script that runs out then repeats its last token instead of ending).
    fn run_reply(
        choice: ToolChoice,
        parallel: bool,
        thinking: bool,
        script: &str,
        budget: Option<usize>,
    ) -> String {
        let tok = fixture_tok();
        let mut f = ToolForcer::new(&tok, &choice, parallel, thinking).unwrap();
        let eom = tok.special_id("<|end_of_msg|>").unwrap();
        if let Some(n) = budget {
            f.bound(n, &[]);
        }
        let ids = tok.encode(script, true);
        let last = if budget.is_some() {
            ids[ids.len() - 1]
        } else {
            eom
        };
        let mut script = Script::new(ids);
        let mut out = Vec::new();
        while out.last() != Some(&eom) && out.len() < budget.unwrap_or(400) {
            let mut chosen = false;
            let id = f.next(&tok, || {
                chosen = true;
                script.pick().unwrap_or(last)
            });
            script.saw(id, chosen);
            out.push(id);
        }
        tok.decode(&out)
    }

    const CALL_GET: &str =
        "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get\" index=\"1\"<|sep|>";

    #[test]
    fn a_demanded_call_comes_when_the_reply_never_closes_its_think_block() {
        let get = || ToolChoice::Function("get".into());
        // The reply ends inside its think block: the blocks are closed and the call opened.
        let ended = run_reply(get(), true, true, "Let me see.<|end_of_msg|>", None);
        let want = format!("Let me see.<|close|>think<|sep|><|open|>response<|sep|>{CALL_GET}");
        assert!(ended.starts_with(&want), "{ended}");
        // A close picked in the think block closes it; one picked in the response closes that.
        let closed = run_reply(get(), true, true, "Plan.<|close|>Answer.<|close|>", None);
        let want = format!("Plan.<|close|>think<|sep|><|open|>response<|sep|>Answer.{CALL_GET}");
        assert!(closed.starts_with(&want), "{closed}");
        let req = run_reply(
            ToolChoice::Required,
            true,
            false,
            "Hi<|close|>message<|sep|>",
            None,
        );
        assert!(
            req.starts_with("Hi<|close|>response<|sep|><|open|>tools<|sep|><|open|>call"),
            "{req}"
        );
        // Thinking that never ends: the budget closes it while the call and its arguments fit.
        let tok = fixture_tok();
        for budget in [100, 300, 1000] {
            let long = run_reply(get(), true, true, "hmm", Some(budget));
            assert_eq!(tok.encode(&long, true).len(), budget, "{long}");
            let at = long
                .find(CALL_GET)
                .unwrap_or_else(|| panic!("{budget}: {long}"));
            let args = tok.encode(&long[at + CALL_GET.len()..], true).len();
            assert!(
                args == 0 || args >= (budget / 4).min(ARGUMENT_RESERVE),
                "{budget}: {args}"
            );
        }
        // Auto steers nothing.
        assert_eq!(
            run_reply(ToolChoice::Auto, false, true, ANSWER, None),
            ANSWER
        );
        // A reply that closes its blocks and makes its calls itself is let through as written:
        // nothing is forced twice.
        let own = format!("Plan.<|close|>think<|sep|><|open|>response<|sep|>{CALLS}");
        assert_eq!(run_reply(ToolChoice::Required, true, true, &own, None), own);
    }

    const ANSWER: &str = "Plain.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
    const CALLS: &str = "ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"a\" index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"b\" index=\"2\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

    #[test]
    fn choices_force_the_tokens_they_imply() {
        assert!(ToolForcer::new(&fixture_tok(), &ToolChoice::Auto, true, false).is_none());
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
