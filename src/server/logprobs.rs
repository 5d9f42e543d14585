//! Log-probabilities of generated tokens, from the exact fp32 logits the chooser saw (before
//! temperature or top-p, so sampling settings never change them), and their OpenAI shapes:
//! chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` and completions'
//! `{tokens, token_logprobs, top_logprobs, text_offset}`. Knows nothing of requests.

use serde_json::{json, Map, Value};

use crate::tokenizer::Tokenizer;

/// One generated token's log-probability and the most likely alternatives at its position.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token.
    pub id: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The `n` most likely tokens and theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits` at `id`, and the `n` most likely tokens (computed in f64).
pub fn of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let m = logits
        .iter()
        .filter(|v| !v.is_nan())
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let sum: f64 = logits
        .iter()
        .filter(|v| !v.is_nan())
        .map(|&v| (v as f64 - m).exp())
        .sum();
    let lse = m + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - lse) as f32;
    let mut idx: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    let n = n.min(idx.len());
    if n > 0 {
        let by = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        idx.select_nth_unstable_by(n - 1, by);
        idx.truncate(n);
        idx.sort_by(by);
    } else {
        idx.clear();
    }
    TokenLogprob {
        id,
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |_| lp(id as usize)),
        top: idx.into_iter().map(|i| (i as u32, lp(i))).collect(),
    }
}

fn text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let b = tok.token_bytes(id);
    (String::from_utf8_lossy(&b).into_owned(), b)
}

/// Chat's shape for these tokens.
pub fn chat_json(tok: &Tokenizer, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let (t, b) = text(tok, id);
        json!({"token": t, "logprob": lp, "bytes": b})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.id, l.logprob);
            e["top_logprobs"] = l.top.iter().map(|&(i, p)| entry(i, p)).collect();
            e
        })
        .collect();
    json!({ "content": content })
}

/// Completions' shape for these tokens; `offset` is the character offset of the first one.
pub fn completion_json(tok: &Tokenizer, lps: &[TokenLogprob], offset: usize) -> Value {
    let (mut tokens, mut lp, mut top, mut off) = (vec![], vec![], vec![], vec![]);
    let mut at = offset;
    for l in lps {
        let (t, _) = text(tok, l.id);
        off.push(at);
        at += t.chars().count();
        tokens.push(t);
        lp.push(l.logprob);
        let mut m = Map::new();
        for &(i, p) in &l.top {
            m.entry(text(tok, i).0).or_insert(json!(p));
        }
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": off})
}

/// Completions' shape with the prompt echoed: its tokens first (the first one has no
/// log-probability or alternatives: `null`), then the generated ones.
pub fn echo_json(tok: &Tokenizer, prompt: &[TokenLogprob], generated: &[TokenLogprob]) -> Value {
    let all: Vec<TokenLogprob> = prompt.iter().chain(generated).cloned().collect();
    let mut v = completion_json(tok, &all, 0);
    if !prompt.is_empty() {
        v["token_logprobs"][0] = Value::Null;
        v["top_logprobs"][0] = Value::Null;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::of;

    #[test]
    fn log_softmax_and_top() {
        let l = [1.0f32, 3.0, 3.0, -2.0];
        let r = of(&l, 0, 3);
        let lse = (1f64.exp() + 2.0 * 3f64.exp() + (-2f64).exp()).ln();
        assert!((r.logprob as f64 - (1.0 - lse)).abs() < 1e-6);
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2, 0]);
        let total: f64 = l.iter().map(|&v| ((v as f64) - lse).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert!(of(&l, 1, 0).top.is_empty());
        assert_eq!(of(&l, 1, 10).top.len(), 4);
    }
}
