//! K3's tokenizer: tiktoken-format byte-level BPE (`tiktoken.model` ranks, tiktoken's merge rule,
//! K3's split regex), the 256 reserved specials named by `tokenizer_config.json`, lossy UTF-8
//! decoding and an incremental decoder for streaming.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine;
use fancy_regex::Regex;

use crate::{Error, Result};

/// K3's pre-tokenisation pattern (spec §4.1), the eight alternatives joined by `|`.
pub const K3_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);

/// Number of reserved special ids after the BPE ranks.
pub const NUM_SPECIALS: u32 = 256;

/// A tiktoken-style BPE tokenizer.
pub struct Tokenizer {
    ranks: HashMap<Vec<u8>, u32>,
    tokens: Vec<Vec<u8>>,
    specials: Vec<(String, u32)>,
    special_by_id: HashMap<u32, String>,
    regex: Regex,
    safety_split: bool,
}

/// Parses `tiktoken.model` text: `base64(bytes) rank` per line.
pub fn parse_ranks(text: &str, label: &str) -> Result<Vec<Vec<u8>>> {
    let mut out: Vec<Option<Vec<u8>>> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |m: &str| Error::Msg(format!("{label} line {}: {m}", n + 1));
        let mut it = line.split_whitespace();
        let (tok, rank) = (
            it.next().ok_or_else(|| bad("empty"))?,
            it.next().ok_or_else(|| bad("no rank"))?,
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(tok)
            .map_err(|_| bad("bad base64"))?;
        let rank: usize = rank.parse().map_err(|_| bad("rank is not a number"))?;
        if rank >= 10_000_000 {
            return Err(bad("rank too large"));
        }
        if out.len() <= rank {
            out.resize(rank + 1, None);
        }
        out[rank] = Some(bytes);
    }
    out.into_iter()
        .enumerate()
        .map(|(i, b)| {
            b.ok_or_else(|| {
                Error::Msg(format!(
                    "{label}: rank {i} is missing (ranks must be contiguous)"
                ))
            })
        })
        .collect()
}

/// tiktoken's merge rule: repeatedly merge the adjacent pair whose merged bytes have the lowest
/// rank (leftmost on ties); returns the part boundaries. The candidate pairs sit in a min-heap
/// keyed by `(rank, start)` with stale entries skipped, so a piece of n bytes costs O(n log n)
/// rather than a rescan of every pair per merge.
fn byte_pair_merge(ranks: &HashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<usize> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let n = piece.len();
    if n < 2 {
        return (0..=n).collect();
    }
    // Parts form a linked list over their start offsets: part `i` is `piece[i..next[i]]`.
    let mut next: Vec<usize> = (1..=n).collect();
    let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
    let mut alive = vec![true; n];
    // Rank of the pair starting at part `i` (with the part after it), if it merges.
    let pair_rank = |i: usize, next: &[usize]| -> Option<u32> {
        let j = next[i];
        (j < n)
            .then(|| ranks.get(&piece[i..next[j]]).copied())
            .flatten()
    };
    let mut rank: Vec<Option<u32>> = (0..n).map(|i| pair_rank(i, &next)).collect();
    let mut heap: BinaryHeap<Reverse<(u32, usize)>> = rank
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.map(|r| Reverse((r, i))))
        .collect();
    while let Some(Reverse((r, i))) = heap.pop() {
        if !alive[i] || rank[i] != Some(r) {
            continue; // stale
        }
        let j = next[i];
        alive[j] = false;
        next[i] = next[j];
        if next[j] < n {
            prev[next[j]] = i;
        }
        rank[i] = pair_rank(i, &next);
        if let Some(r) = rank[i] {
            heap.push(Reverse((r, i)));
        }
        let p = prev[i];
        if p < n {
            rank[p] = pair_rank(p, &next);
            if let Some(r) = rank[p] {
                heap.push(Reverse((r, p)));
            }
        }
    }
    let mut bounds: Vec<usize> = (0..n).filter(|&i| alive[i]).collect();
    bounds.push(n);
    bounds
}

impl Tokenizer {
    /// A tokenizer from ranks, named specials `(text, id)` and a split pattern.
    pub fn new(tokens: Vec<Vec<u8>>, specials: Vec<(String, u32)>, pattern: &str) -> Result<Self> {
        let ranks = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let regex = Regex::new(pattern).map_err(|e| Error::Msg(format!("split pattern: {e}")))?;
        let special_by_id = specials.iter().map(|(s, i)| (*i, s.clone())).collect();
        let mut specials = specials;
        // Longest first, so a special that is a prefix of another never wins.
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Tokenizer {
            ranks,
            tokens,
            specials,
            special_by_id,
            regex,
            safety_split: true,
        })
    }

    /// Turns the 400,000-character / 25,000-same-class-run splitting of `tokenization_kimi.py`
    /// on or off (tiktoken's Rust core does not split; K3 does).
    pub fn with_safety_split(mut self, on: bool) -> Self {
        self.safety_split = on;
        self
    }

    /// Loads `tiktoken.model` and `tokenizer_config.json` from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tp = dir.join("tiktoken.model");
        let text = std::fs::read_to_string(&tp).map_err(|e| Error::io(&tp, e))?;
        let tokens = parse_ranks(&text, &tp.display().to_string())?;
        let n = tokens.len() as u32;
        let mut named: HashMap<u32, String> = (0..NUM_SPECIALS)
            .map(|k| (n + k, format!("<|reserved_token_{}|>", n + k)))
            .collect();
        let cp = dir.join("tokenizer_config.json");
        if cp.is_file() {
            let v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&cp).map_err(|e| Error::io(&cp, e))?)
                    .map_err(|e| Error::Json {
                        path: cp.clone(),
                        source: e,
                    })?;
            if let Some(m) = v.get("added_tokens_decoder").and_then(|m| m.as_object()) {
                for (id, e) in m {
                    if let (Ok(id), Some(c)) =
                        (id.parse::<u32>(), e.get("content").and_then(|c| c.as_str()))
                    {
                        named.insert(id, c.to_string());
                    }
                }
            }
        }
        // K3's vocabulary is the BPE ranks plus 256 reserved specials: another size means the
        // tokenizer and the model do not belong together.
        let cfgp = dir.join("config.json");
        if cfgp.is_file() {
            let cfg = crate::K3Config::from_file(&cfgp)?;
            let vocab = cfg.text().vocab_size;
            if vocab != n as usize + NUM_SPECIALS as usize {
                return Err(Error::Msg(format!(
                    "{}: {n} ranks + {NUM_SPECIALS} specials do not make config.json's vocab_size {vocab} ({}): the tokenizer files do not belong to this model",
                    tp.display(),
                    cfgp.display()
                )));
            }
        }
        Self::new(
            tokens,
            named.into_iter().map(|(i, s)| (s, i)).collect(),
            K3_PATTERN,
        )
    }

    /// Number of BPE ranks (the first special id).
    pub fn num_ranks(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// The id of a special token's text.
    pub fn special_id(&self, s: &str) -> Option<u32> {
        self.specials.iter().find(|(t, _)| t == s).map(|(_, i)| *i)
    }

    /// The text of special token `id` (`None` for ordinary tokens).
    pub fn special_text(&self, id: u32) -> Option<&str> {
        if (id as usize) < self.tokens.len() {
            return None;
        }
        self.special_by_id.get(&id).map(|s| s.as_str())
    }

    fn encode_piece(&self, piece: &[u8], out: &mut Vec<u32>) {
        if let Some(&r) = self.ranks.get(piece) {
            out.push(r);
            return;
        }
        let b = byte_pair_merge(&self.ranks, piece);
        for w in b.windows(2) {
            // Every single byte is a rank, so every part is found.
            if let Some(&r) = self.ranks.get(&piece[w[0]..w[1]]) {
                out.push(r);
            }
        }
    }

    /// Ordinary text (specials are not recognised): regex pieces, then BPE.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let chunks = if self.safety_split {
            safety_chunks(text)
        } else {
            vec![text]
        };
        for chunk in chunks {
            let mut pos = 0;
            while pos < chunk.len() {
                match self.regex.find_from_pos(chunk, pos) {
                    Ok(Some(m)) if m.end() > pos => {
                        if m.start() > pos {
                            self.encode_piece(&chunk.as_bytes()[pos..m.start()], &mut out);
                        }
                        self.encode_piece(m.as_str().as_bytes(), &mut out);
                        pos = m.end();
                    }
                    _ => {
                        self.encode_piece(&chunk.as_bytes()[pos..], &mut out);
                        break;
                    }
                }
            }
        }
        out
    }

    /// Encodes text; special-token spellings are recognised only when `allow_special`.
    pub fn encode(&self, text: &str, allow_special: bool) -> Vec<u32> {
        if !allow_special {
            return self.encode_ordinary(text);
        }
        let mut out = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let next = self
                .specials
                .iter()
                .filter_map(|(s, id)| rest.find(s.as_str()).map(|p| (p, s.len(), *id)))
                .min_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
            match next {
                Some((p, len, id)) => {
                    out.extend(self.encode_ordinary(&rest[..p]));
                    out.push(id);
                    rest = &rest[p + len..];
                }
                None => {
                    out.extend(self.encode_ordinary(rest));
                    break;
                }
            }
        }
        out
    }

    /// The bytes of one token (a special's text for special ids; empty for unknown ids).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        match self.tokens.get(id as usize) {
            Some(b) => b.clone(),
            None => self
                .special_by_id
                .get(&id)
                .map(|s| s.as_bytes().to_vec())
                .unwrap_or_default(),
        }
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| self.token_bytes(i)).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Splits very long inputs as tiktoken does: slices of 400,000 characters, and runs of more
/// than 25,000 characters of the same class (whitespace or not).
fn safety_chunks(text: &str) -> Vec<&str> {
    const SLICE: usize = 400_000;
    const RUN: usize = 25_000;
    if text.len() <= RUN {
        return vec![text];
    }
    let mut out = Vec::new();
    let mut start = 0;
    let mut count = 0;
    let mut run = 0;
    let mut last_ws: Option<bool> = None;
    for (i, ch) in text.char_indices() {
        let ws = ch.is_whitespace();
        run = if last_ws == Some(ws) { run + 1 } else { 1 };
        last_ws = Some(ws);
        if count >= SLICE || run > RUN {
            out.push(&text[start..i]);
            start = i;
            count = 0;
            run = 1;
        }
        count += 1;
    }
    out.push(&text[start..]);
    out
}

/// Turns a stream of token ids into text deltas that never split a code point.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token; returns the text that is now complete. A special token flushes what is
    /// pending first, so its text always ends the returned string whole.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        if let Some(s) = tok.special_text(id) {
            let mut out = self.finish();
            out.push_str(s);
            return out;
        }
        self.pending.extend(tok.token_bytes(id));
        match std::str::from_utf8(&self.pending) {
            Ok(s) => {
                let s = s.to_string();
                self.pending.clear();
                s
            }
            Err(e) => {
                let good = e.valid_up_to();
                // An invalid sequence (not just an incomplete one) is emitted lossily now.
                let cut = match e.error_len() {
                    Some(bad) => good + bad,
                    None => good,
                };
                let out = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
                self.pending.drain(..cut);
                out
            }
        }
    }

    /// Flushes whatever is left (lossily).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests;
