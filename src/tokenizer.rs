//! Tokenizers from a checkpoint's files: a `tokenizer.json`, or a `tiktoken.model` (Kimi's
//! format) whose ranks run as a `tokenizers::Tokenizer` (byte-level BPE with the format's split
//! regex, built in `hf`), the 256 reserved specials named by `tokenizer_config.json`
//! (recognised only where the caller allows), tiktoken's safety split of very long inputs, lossy
//! UTF-8 decoding and an incremental decoder for streaming. Ours: reading `tiktoken.model` and
//! the specials, and decoding from the rank bytes.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine;

use crate::{Error, Result};

/// The split pattern of the `tiktoken.model` format (the files Kimi models ship; spec §4.1):
/// the files hold ranks and specials but not the pattern, so here it is part of the format.
/// The eight alternatives joined by `|`.
pub const TIKTOKEN_PATTERN: &str = concat!(
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
    /// The ranks and the split pattern as a `tokenizers` pipeline (no specials).
    hf: tokenizers::Tokenizer,
    tokens: Vec<Vec<u8>>,
    /// The rank of each single byte (tiktoken vocabularies hold all 256).
    byte_rank: [u32; 256],
    specials: Vec<(String, u32)>,
    special_by_id: HashMap<u32, String>,
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

impl Tokenizer {
    /// A tokenizer from ranks, named specials `(text, id)` and a split pattern.
    pub fn new(tokens: Vec<Vec<u8>>, specials: Vec<(String, u32)>, pattern: &str) -> Result<Self> {
        let hf = hf::build(&tokens, pattern)?;
        Self::assemble(hf, tokens, specials)
    }

    /// A published `tokenizer.json` (a byte-level BPE such as gpt-oss's o200k_harmony) run as
    /// it is: its own pre-tokenizer and merges encode, its vocabulary's bytes decode, and its
    /// added tokens are the specials (never recognised in ordinary text).
    pub fn from_tokenizer_json(path: &Path) -> Result<Self> {
        let mut tk = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Msg(format!("{}: {e}", path.display())))?;
        tk.set_encode_special_tokens(true);
        let (tokens, specials) =
            hf::vocab_bytes(&tk).map_err(|m| Error::Msg(format!("{}: {m}", path.display())))?;
        Ok(Self::assemble(tk, tokens, specials)?.with_safety_split(false))
    }

    fn assemble(
        hf: tokenizers::Tokenizer,
        tokens: Vec<Vec<u8>>,
        specials: Vec<(String, u32)>,
    ) -> Result<Self> {
        let mut byte_rank = [u32::MAX; 256];
        for (i, t) in tokens.iter().enumerate() {
            if let [b] = t[..] {
                byte_rank[b as usize] = i as u32;
            }
        }
        if let Some(b) = byte_rank.iter().position(|&r| r == u32::MAX) {
            return Err(Error::Msg(format!(
                "tokenizer: byte {b:#04x} has no rank (a byte-level BPE needs all 256)"
            )));
        }
        let special_by_id = specials.iter().map(|(s, i)| (*i, s.clone())).collect();
        let mut specials = specials;
        // Longest first, so a special that is a prefix of another never wins.
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Ok(Tokenizer {
            hf,
            tokens,
            byte_rank,
            specials,
            special_by_id,
            safety_split: true,
        })
    }

    /// Turns the 400,000-character / 25,000-same-class-run splitting of `tokenization_kimi.py`
    /// on or off (tiktoken's Rust core does not split; K3 does).
    pub fn with_safety_split(mut self, on: bool) -> Self {
        self.safety_split = on;
        self
    }

    /// Loads `tiktoken.model` and `tokenizer_config.json` from a model directory, or, without
    /// `tiktoken.model`, its `tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tp = dir.join("tiktoken.model");
        let json = dir.join("tokenizer.json");
        if !tp.is_file() && json.is_file() {
            return Self::from_tokenizer_json(&json);
        }
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
        Self::new(
            tokens,
            named.into_iter().map(|(i, s)| (s, i)).collect(),
            TIKTOKEN_PATTERN,
        )
    }

    /// Number of BPE ranks (the first special id).
    pub fn num_ranks(&self) -> u32 {
        self.tokens.len() as u32
    }

    /// Ids in use: the ranks and the specials after them (the highest id + 1).
    pub fn num_ids(&self) -> u32 {
        let top = self.special_by_id.keys().max().map_or(0, |&i| i + 1);
        top.max(self.tokens.len() as u32)
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

    /// Ordinary text (specials are not recognised): the split pattern, then BPE, through the
    /// `tokenizers` pipeline.
    pub fn encode_ordinary(&self, text: &str) -> Vec<u32> {
        let chunks = if self.safety_split {
            safety_chunks(text)
        } else {
            vec![text]
        };
        let mut out = Vec::new();
        for chunk in chunks {
            match self.hf.encode_fast(chunk, false) {
                Ok(e) => out.extend_from_slice(e.get_ids()),
                Err(e) => {
                    // The pipeline has no failure on valid UTF-8 that we know of; should one
                    // appear, the bytes still reach the model exactly, one token per byte.
                    tracing::warn!(
                        "tokenizer: {e}; encoding {} bytes one per token",
                        chunk.len()
                    );
                    out.extend(chunk.bytes().map(|b| self.byte_rank[b as usize]));
                }
            }
        }
        out
    }

    /// The same tokenizer as a `tokenizers::Tokenizer` with the specials as added tokens (what
    /// `deltafin export-tokenizer` writes as `tokenizer.json`).
    pub fn to_hf(&self) -> Result<tokenizers::Tokenizer> {
        let mut named: Vec<(String, u32)> = self
            .special_by_id
            .iter()
            .map(|(i, s)| (s.clone(), *i))
            .collect();
        named.sort_by_key(|(_, i)| *i);
        hf::with_specials(self.hf.clone(), &named)
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
#[derive(Debug, Default)]
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

pub mod hf;
#[cfg(test)]
mod tests;
pub mod train;
