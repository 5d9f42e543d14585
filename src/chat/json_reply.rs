//! `response_format: json_object`: the reply's response block is masked to one JSON object
//! (`JsonMask`), then closed by forced tokens; a think block before it is left free. Knows the
//! chat format's markers, nothing of sampling or HTTP; the mask itself is `json_mask.rs`.

use std::collections::VecDeque;

use super::force::segs_ids;
use super::{close_tag, Segment};
use crate::tokenizer::Tokenizer;

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
