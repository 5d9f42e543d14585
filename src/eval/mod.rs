//! The quality harness behind `deltafin eval`: teacher-forced NLL over a text in windows, the
//! comparison of two configurations of one model position by position, an add-k bigram baseline,
//! and scoring against reference continuations (JSONL with reference top log-probabilities, the
//! form ds4 gates releases on). Anything that yields logits for a window is a `Scorer`: any
//! runtime `Model`, or a trainer's fp32 network (K3-tiny's implements it in its folder). This module reads logits only; it
//! must not reach into a model's internals.

pub mod bigram;
pub mod reference;

use crate::runtime::model::Model;
use crate::Result;

/// Something that gives the logits `[T][V]` of every position of a window scored from scratch.
pub trait Scorer {
    /// Logits of each position of `ids`, from an empty context.
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>>;
}

impl Scorer for dyn Model + '_ {
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let mut state = self.new_state();
        Ok(self.forward_all(ids, &mut state)?.to_vec2()?)
    }
}

impl Scorer for &dyn Model {
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        (*self).window_logits(ids)
    }
}

impl Scorer for Box<dyn Model> {
    fn window_logits(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.as_ref().window_logits(ids)
    }
}

/// Evaluation windows: consecutive, each `len` inputs followed by their next tokens (the last
/// shorter), every token after the first scored exactly once.
pub fn eval_windows(tokens: &[u32], len: usize) -> Vec<&[u32]> {
    let len = len.max(1);
    (0..tokens.len().saturating_sub(1))
        .step_by(len)
        .map(|i| &tokens[i..(i + len + 1).min(tokens.len())])
        .collect()
}

/// `log softmax(logits)[target]`, in f64.
pub fn log_prob(logits: &[f32], target: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z: f64 = logits.iter().map(|&x| (x as f64 - m).exp()).sum();
    logits[target as usize] as f64 - m - z.ln()
}

/// Teacher-forced NLL of a text.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NllReport {
    /// Tokens scored.
    pub tokens: usize,
    /// Average negative log-likelihood, nats per token.
    pub nll: f64,
    /// `exp(nll)`.
    pub perplexity: f64,
    /// Window length (each window starts from an empty context).
    pub window: usize,
}

/// The windows of `tokens` (at most `max_tokens` of them scored) of length `window`.
pub fn windows(tokens: &[u32], window: usize, max_tokens: Option<usize>) -> Vec<&[u32]> {
    let end = max_tokens.map_or(tokens.len(), |m| (m + 1).min(tokens.len()));
    eval_windows(&tokens[..end], window)
}

/// Average NLL of `scorer` over `tokens` in windows of `window`.
pub fn nll(
    scorer: &dyn Scorer,
    tokens: &[u32],
    window: usize,
    max_tokens: Option<usize>,
    mut progress: impl FnMut(usize),
) -> Result<NllReport> {
    let mut total = 0f64;
    let mut n = 0usize;
    for w in windows(tokens, window, max_tokens) {
        let logits = scorer.window_logits(&w[..w.len() - 1])?;
        for (row, &t) in logits.iter().zip(&w[1..]) {
            total -= log_prob(row, t);
            n += 1;
        }
        progress(n);
    }
    let nll = total / n.max(1) as f64;
    Ok(NllReport {
        tokens: n,
        nll,
        perplexity: nll.exp(),
        window,
    })
}

/// Two configurations of one model compared position by position (A is the reference).
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompareReport {
    /// Positions compared.
    pub positions: usize,
    /// Share of positions where the top-1 token agrees.
    pub top1_agreement: f64,
    /// Share of positions where A's top-5 tokens are B's top-5, in the same order.
    pub top5_order_kept: f64,
    /// Whether the first position kept A's top-5 order.
    pub first_top5_kept: bool,
    /// Mean KL(A‖B) over positions, nats.
    pub kl_mean: f64,
    /// Largest KL(A‖B) at one position.
    pub kl_max: f64,
    /// Mean |A's top logit − B's logit of that token|.
    pub top_logit_delta_mean: f64,
    /// Median of that difference relative to |A's top logit|.
    pub top_logit_rel_median: f64,
    /// Worst relative difference.
    pub top_logit_rel_worst: f64,
    /// Relative top-logit difference at the first position.
    pub first_top_logit_rel: f64,
    /// NLL of A and of B over the same tokens.
    pub nll_a: f64,
    /// NLL of B.
    pub nll_b: f64,
}

fn log_softmax(v: &[f32]) -> Vec<f64> {
    let m = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let z: f64 = v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    v.iter().map(|&x| x as f64 - m - z).collect()
}

/// Compares `a` and `b` over the windows of `tokens`.
pub fn compare(
    a: &dyn Scorer,
    b: &dyn Scorer,
    tokens: &[u32],
    window: usize,
    max_tokens: Option<usize>,
) -> Result<CompareReport> {
    let (mut top1, mut top5, mut kl_sum, mut kl_max, mut dsum) = (0usize, 0usize, 0f64, 0f64, 0f64);
    let (mut na, mut nb) = (0f64, 0f64);
    let mut rel = Vec::new();
    let mut first_kept = false;
    let mut n = 0usize;
    for w in windows(tokens, window, max_tokens) {
        let ids = &w[..w.len() - 1];
        let (la, lb) = (a.window_logits(ids)?, b.window_logits(ids)?);
        for ((ra, rb), &t) in la.iter().zip(&lb).zip(&w[1..]) {
            let ta = crate::runtime::generate::top_k(ra, 5);
            let tb = crate::runtime::generate::top_k(rb, 5);
            let same5 = ta.iter().map(|x| x.0).eq(tb.iter().map(|x| x.0));
            if n == 0 {
                first_kept = same5;
            }
            top1 += (ta[0].0 == tb[0].0) as usize;
            top5 += same5 as usize;
            let (pa, pb) = (log_softmax(ra), log_softmax(rb));
            let kl: f64 = pa.iter().zip(&pb).map(|(x, y)| x.exp() * (x - y)).sum();
            kl_sum += kl;
            kl_max = kl_max.max(kl);
            let d = (ta[0].1 - rb[ta[0].0 as usize]).abs() as f64;
            dsum += d;
            rel.push(d / (ta[0].1.abs() as f64).max(1e-12));
            na -= pa[t as usize];
            nb -= pb[t as usize];
            n += 1;
        }
    }
    let first_rel = rel.first().copied().unwrap_or(0.0);
    rel.sort_by(f64::total_cmp);
    let nf = n.max(1) as f64;
    Ok(CompareReport {
        positions: n,
        top1_agreement: top1 as f64 / nf,
        top5_order_kept: top5 as f64 / nf,
        first_top5_kept: first_kept,
        kl_mean: kl_sum / nf,
        kl_max,
        top_logit_delta_mean: dsum / nf,
        top_logit_rel_median: rel.get(rel.len() / 2).copied().unwrap_or(0.0),
        top_logit_rel_worst: rel.last().copied().unwrap_or(0.0),
        first_top_logit_rel: first_rel,
        nll_a: na / nf,
        nll_b: nb / nf,
    })
}

/// Whether one whitespace-separated token of generated text is a known word: surrounding
/// punctuation stripped, then every part between hyphens or apostrophes made of letters only
/// and, lower-cased, in `vocabulary`. A token with anything else inside (digits, symbols, U+FFFD:
/// what noise decodes to) is not a word. `None` for pure punctuation.
pub fn known_word(token: &str, vocabulary: &std::collections::HashSet<String>) -> Option<bool> {
    let t = token.trim_matches(|c: char| !c.is_alphanumeric());
    if t.is_empty() {
        return None;
    }
    let parts: Vec<&str> = t
        .split(['-', '\'', '`', '\u{2019}'])
        .filter(|p| !p.is_empty())
        .collect();
    Some(
        !parts.is_empty()
            && parts.iter().all(|p| {
                p.chars().all(char::is_alphabetic) && vocabulary.contains(&p.to_lowercase())
            }),
    )
}

/// Share of the words of `text` (whitespace-separated, see `known_word`) that are known, and
/// how many words there were.
pub fn known_word_share(
    text: &str,
    vocabulary: &std::collections::HashSet<String>,
) -> (f64, usize) {
    let judged: Vec<bool> = text
        .split_whitespace()
        .filter_map(|t| known_word(t, vocabulary))
        .collect();
    let known = judged.iter().filter(|k| **k).count();
    (known as f64 / judged.len().max(1) as f64, judged.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_windows_score_every_token_once() {
        let t: Vec<u32> = (0..10).collect();
        let w = eval_windows(&t, 4);
        let scored: Vec<u32> = w.iter().flat_map(|w| w[1..].to_vec()).collect();
        assert_eq!(scored, (1..10).collect::<Vec<u32>>());
    }

    #[test]
    fn known_words_need_letters_only_and_the_list() {
        let v: std::collections::HashSet<String> = ["the", "king", "s", "good", "nature"]
            .map(String::from)
            .into();
        let (share, n) = known_word_share(
            "The king's good-nature, \"the\" -- or0q\u{fffd}K[ kingx",
            &v,
        );
        // Words: the, king's, good-nature, "the", or0q�K[, kingx (`--` is punctuation).
        assert_eq!(n, 6);
        assert!((share - 4.0 / 6.0).abs() < 1e-12, "{share}");
    }
}
