//! Drafters for speculative decoding: they only *propose* tokens; the model verifies every one
//! (`super::spec`), so a drafter can change the speed, never the output.
//!
//! - `NgramDrafter`: the longest suffix of the context (prompt and generated text) that occurred
//!   before, continued by what followed it (copying through its own proposal, so a loop of
//!   period p is continued for any depth).
//! - `TextDrafter`: the plumbing for a draft model with its own tokenizer: the context is seen
//!   through text and the draft's text is re-tokenised with K3's tokenizer (Deltafin's
//!   universal assisted drafting). A draft model only implements `TextModel`.
//!
//! Owns drafting; must not touch the model, its state or the chooser.

use std::sync::Arc;

use crate::runtime::observe::Observer;
use crate::tokenizer::Tokenizer;

/// Proposes tokens likely to follow a context.
pub trait Drafter: Send {
    /// Up to `k` tokens to follow `context` (every token so far, the last emitted one included).
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32>;

    /// Told how many of the last proposal the model accepted (for drafters that adapt).
    fn accepted(&mut self, _proposed: usize, _accepted: usize) {}

    /// What watches every pass of the target over this drafter's sequence (a drafter that
    /// reads the target's hidden states taps them here; the decoding loop passes it with each
    /// pass, so no second target pass is needed).
    fn observer(&self) -> Option<&dyn Observer> {
        None
    }
}

/// The n-gram drafter: longest suffix match over the context, from `max_n` tokens down to
/// `min_n`, the most recent earlier occurrence first.
#[derive(Debug, Clone)]
pub struct NgramDrafter {
    /// Shortest suffix that may match.
    pub min_n: usize,
    /// Longest suffix tried.
    pub max_n: usize,
    /// Most context tokens searched (the most recent ones).
    pub window: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            min_n: 2,
            max_n: 8,
            window: 1 << 16,
        }
    }
}

impl Drafter for NgramDrafter {
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        let ctx = &context[context.len().saturating_sub(self.window)..];
        let len = ctx.len();
        if k == 0 || len < self.min_n + 1 {
            return Vec::new();
        }
        for n in (self.min_n.max(1)..=self.max_n.min(len - 1)).rev() {
            let suffix = &ctx[len - n..];
            // Most recent earlier occurrence: it ends before the suffix ends.
            let found = (0..len - n).rev().find(|&i| &ctx[i..i + n] == suffix);
            if let Some(i) = found {
                // Copy what followed; past the context, copy the proposal itself (a loop).
                let from = i + n;
                let mut out: Vec<u32> = Vec::with_capacity(k);
                for j in from..from + k {
                    out.push(if j < len { ctx[j] } else { out[j - len] });
                }
                return out;
            }
        }
        Vec::new()
    }
}

/// A draft model seen through text (its own tokenizer, its own state).
pub trait TextModel: Send {
    /// A continuation of `text`, about `max_tokens` of the draft model's tokens long.
    fn continue_text(&mut self, text: &str, max_tokens: usize) -> String;
}

/// Adapts a `TextModel` to K3's tokens: the last `window` context tokens are decoded to text,
/// the draft continues it, and the continuation is re-tokenised with K3's tokenizer together
/// with the context text; the ids after the re-tokenised context are the proposal. When the
/// context's own text tokenises differently once continued, nothing is proposed.
pub struct TextDrafter<M: TextModel> {
    model: M,
    tokenizer: Arc<Tokenizer>,
    /// Context tokens shown to the draft model.
    pub window: usize,
}

impl<M: TextModel> TextDrafter<M> {
    /// A drafter over `model`, re-tokenising with K3's `tokenizer`.
    pub fn new(model: M, tokenizer: Arc<Tokenizer>) -> Self {
        TextDrafter {
            model,
            tokenizer,
            window: 256,
        }
    }
}

impl<M: TextModel> Drafter for TextDrafter<M> {
    fn propose(&mut self, context: &[u32], k: usize) -> Vec<u32> {
        if k == 0 || context.is_empty() {
            return Vec::new();
        }
        let ctx = &context[context.len().saturating_sub(self.window)..];
        let text = self.tokenizer.decode(ctx);
        let cont = self.model.continue_text(&text, k);
        if cont.is_empty() {
            return Vec::new();
        }
        let all = self.tokenizer.encode_ordinary(&format!("{text}{cont}"));
        // The re-tokenised context must reproduce the context's own last tokens; whatever
        // follows the longest such prefix is the draft.
        let mine = self.tokenizer.encode_ordinary(&text);
        let same = mine.iter().zip(&all).take_while(|(a, b)| a == b).count();
        if same < mine.len() || same == 0 || ctx.last() != mine.last() {
            // The boundary token changed: propose nothing rather than a misaligned draft.
            return Vec::new();
        }
        all[same..].iter().copied().take(k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_continues_the_latest_match_and_loops() {
        let mut d = NgramDrafter::default();
        // "1 2 3 4 1 2" → suffix "1 2" matched at 0: continue "3 4 1 2 3 ...".
        assert_eq!(d.propose(&[1, 2, 3, 4, 1, 2], 6), vec![3, 4, 1, 2, 3, 4]);
        // The longer suffix wins over a more recent shorter one.
        assert_eq!(d.propose(&[7, 8, 9, 5, 8, 9, 6, 7, 8, 9], 2), vec![5, 8]);
        // No repeat, nothing proposed; k = 0, nothing.
        assert!(d.propose(&[1, 2, 3, 4, 5], 4).is_empty());
        assert!(d.propose(&[1, 2, 1, 2], 0).is_empty());
        // A run of one token.
        assert_eq!(d.propose(&[5, 5, 5], 3), vec![5, 5, 5]);
    }
}
