//! Reference continuations (the form ds4 gates releases on): JSONL lines of a prompt, the
//! continuation tokens a reference model produced, and its top log-probabilities at each
//! continuation position. `write` makes such a file from any `Scorer` (greedy continuations);
//! `score` measures a model against one: the continuation's NLL under the model, top-1
//! agreement with the reference, and KL over the reference's top-k.

use std::collections::HashMap;

use super::{log_prob, Scorer};
use crate::{Error, Result};

/// One reference line.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RefLine {
    /// Prompt text (informational; `prompt_ids` is what is scored).
    #[serde(default)]
    pub prompt: Option<String>,
    /// Prompt token ids.
    pub prompt_ids: Vec<u32>,
    /// The reference's continuation tokens.
    pub continuation: Vec<u32>,
    /// Per continuation position, the reference's top `[token, log-probability]` pairs.
    pub top_logprobs: Vec<Vec<(u32, f64)>>,
}

/// A model scored against reference continuations.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RefReport {
    /// Lines scored.
    pub lines: usize,
    /// Continuation positions scored.
    pub positions: usize,
    /// Average NLL of the reference continuation under the model, nats/token.
    pub nll: f64,
    /// Average NLL the reference gave its own continuation (where its top list holds the token).
    pub reference_nll: f64,
    /// Share of positions where the model's top-1 is the reference's top-1.
    pub top1_agreement: f64,
    /// Mean KL(reference ‖ model) over the reference's top-k, both renormalised on those ids.
    pub topk_kl_mean: f64,
}

/// Parses a JSONL reference file.
pub fn parse(text: &str, label: &str) -> Result<Vec<RefLine>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let r: RefLine = serde_json::from_str(l)
                .map_err(|e| Error::Msg(format!("{label}:{}: {e}", i + 1)))?;
            if r.top_logprobs.len() != r.continuation.len() || r.prompt_ids.is_empty() {
                return Err(Error::Msg(format!(
                    "{label}:{}: needs a non-empty prompt_ids and one top_logprobs list per continuation token",
                    i + 1
                )));
            }
            Ok(r)
        })
        .collect()
}

/// Greedy continuations of `len` tokens for each prompt, with the top-`top` log-probabilities.
pub fn write(
    scorer: &dyn Scorer,
    prompts: &[(Option<String>, Vec<u32>)],
    len: usize,
    top: usize,
) -> Result<Vec<RefLine>> {
    let mut out = Vec::new();
    for (text, ids) in prompts {
        let mut seq = ids.clone();
        for _ in 0..len {
            let logits = scorer.window_logits(&seq)?;
            let last = logits
                .last()
                .ok_or_else(|| Error::Msg("empty prompt".into()))?;
            seq.push(crate::runtime::generate::argmax(last));
        }
        // One teacher-forced pass gives every continuation position's distribution.
        let logits = scorer.window_logits(&seq[..seq.len() - 1])?;
        let top_logprobs = (ids.len() - 1..seq.len() - 1)
            .map(|p| {
                crate::runtime::generate::top_k(&logits[p], top)
                    .into_iter()
                    .map(|(t, _)| (t, log_prob(&logits[p], t)))
                    .collect()
            })
            .collect();
        out.push(RefLine {
            prompt: text.clone(),
            prompt_ids: ids.clone(),
            continuation: seq[ids.len()..].to_vec(),
            top_logprobs,
        });
    }
    Ok(out)
}

/// Scores `scorer` against `lines`.
pub fn score(scorer: &dyn Scorer, lines: &[RefLine]) -> Result<RefReport> {
    let (mut nll, mut rnll, mut rn, mut top1, mut kl, mut n) =
        (0f64, 0f64, 0usize, 0usize, 0f64, 0);
    for r in lines {
        let mut seq = r.prompt_ids.clone();
        seq.extend(&r.continuation);
        let logits = scorer.window_logits(&seq[..seq.len() - 1])?;
        for (j, (&tok, refs)) in r.continuation.iter().zip(&r.top_logprobs).enumerate() {
            let row = &logits[r.prompt_ids.len() - 1 + j];
            nll -= log_prob(row, tok);
            let theirs: HashMap<u32, f64> = refs.iter().copied().collect();
            if let Some(lp) = theirs.get(&tok) {
                rnll -= lp;
                rn += 1;
            }
            if let Some(best) = refs.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
                top1 += (crate::runtime::generate::argmax(row) == best.0) as usize;
            }
            // KL over the reference's top-k, each side renormalised on those ids.
            let p: Vec<f64> = refs.iter().map(|x| x.1.exp()).collect();
            let q: Vec<f64> = refs.iter().map(|x| log_prob(row, x.0).exp()).collect();
            let (sp, sq) = (p.iter().sum::<f64>(), q.iter().sum::<f64>());
            if sp > 0.0 && sq > 0.0 {
                kl += p
                    .iter()
                    .zip(&q)
                    .filter(|(a, _)| **a > 0.0)
                    .map(|(a, b)| (a / sp) * ((a / sp) / (b / sq).max(1e-300)).ln())
                    .sum::<f64>();
            }
            n += 1;
        }
    }
    let nf = n.max(1) as f64;
    Ok(RefReport {
        lines: lines.len(),
        positions: n,
        nll: nll / nf,
        reference_nll: rnll / rn.max(1) as f64,
        top1_agreement: top1 as f64 / nf,
        topk_kl_mean: kl / nf,
    })
}
