//! A tiny tiktoken-format BPE vocabulary trained on a built-in text, for the K3-nano fixture,
//! plus K3's special-token names.

use std::collections::HashMap;

use base64::Engine;

/// K3's named specials as (offset from the first special id, spelling) (spec §4.1).
pub const K3_SPECIALS: [(u32, &str); 15] = [
    (0, "[BOS]"),
    (1, "[EOS]"),
    (2, "<|end_of_msg|>"),
    (3, "<|open|>"),
    (4, "<|close|>"),
    (5, "<|sep|>"),
    (6, "[start_header_id]"),
    (7, "[end_header_id]"),
    (9, "[EOT]"),
    (18, "<|media_begin|>"),
    (19, "<|media_content|>"),
    (20, "<|media_end|>"),
    (21, "<|media_pad|>"),
    (65, "<osagent_mode>"),
    (254, "[UNK]"),
];

/// Number of reserved special ids after the BPE ranks.
pub const NUM_SPECIALS: u32 = 256;

/// Text the nano vocabulary is trained on.
const CORPUS: &str = "The capital of France is Paris. The Eiffel Tower is located in Paris. \
The Louvre Museum is also in Paris. The largest planet in our solar system is Jupiter. \
Hello, world! Hello there, how are you today? I am fine, thank you. \
fn main() { println!(\"hello\"); } let x = 1 + 2; if x > 2 { return x; } \
The quick brown fox jumps over the lazy dog. A model reads the weights of the experts it needs. \
Streaming experts from the disk and from the network keeps the memory small. \
Think step by step, then answer the question with a short response. \
Les élèves étudient à l'école. 北京是中国的首都。 Numbers: 12345 67890 3.14159 2026.";

/// Trains `merges` BPE merges on the built-in corpus; returns token byte strings in rank order
/// (the 256 single bytes first).
pub fn train_ranks(merges: usize) -> Vec<Vec<u8>> {
    let mut vocab: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    // Pre-split into words that keep their leading space, as tiktoken's regex roughly does.
    let mut words: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut cur = String::new();
    for ch in CORPUS.chars() {
        if (ch == ' ' || ch.is_ascii_punctuation()) && !cur.is_empty() && cur != " " {
            words.push(cur.bytes().map(|b| vec![b]).collect());
            cur.clear();
        }
        cur.push(ch);
    }
    if !cur.is_empty() {
        words.push(cur.bytes().map(|b| vec![b]).collect());
    }
    for _ in 0..merges {
        let mut counts: HashMap<(Vec<u8>, Vec<u8>), usize> = HashMap::new();
        for w in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_default() += 1;
            }
        }
        let best = counts
            .into_iter()
            .filter(|(_, c)| *c >= 2)
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)));
        let Some(((a, b), _)) = best else { break };
        let merged: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        if vocab.contains(&merged) {
            continue;
        }
        for w in &mut words {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == a && w[i + 1] == b {
                    w[i] = merged.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        vocab.push(merged);
    }
    vocab
}

/// Extends `ranks` with distinct random 2–10-byte tokens (seeded) until it holds `n` ranks, for
/// a vocabulary of real size.
pub fn pad_ranks(mut ranks: Vec<Vec<u8>>, n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut seen: std::collections::HashSet<Vec<u8>> = ranks.iter().cloned().collect();
    let mut rng = crate::checkpoint::rng::Rng::new(seed);
    let alphabet = b" abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    while ranks.len() < n {
        let len = 2 + rng.below(9) as usize;
        let t: Vec<u8> = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
            .collect();
        if seen.insert(t.clone()) {
            ranks.push(t);
        }
    }
    ranks
}

/// The `tiktoken.model` text: `base64(bytes) rank` per line.
pub fn tiktoken_model_text(ranks: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for (i, t) in ranks.iter().enumerate() {
        s.push_str(&base64::engine::general_purpose::STANDARD.encode(t));
        s.push(' ');
        s.push_str(&i.to_string());
        s.push('\n');
    }
    s
}

/// `tokenizer_config.json` with K3's special-token names at ids `first_special + offset`.
pub fn tokenizer_config_json(first_special: u32) -> serde_json::Value {
    let mut decoder = serde_json::Map::new();
    let mut named: HashMap<u32, &str> = K3_SPECIALS.iter().copied().collect();
    named.insert(255, "[PAD]");
    for off in 0..NUM_SPECIALS {
        let id = first_special + off;
        let content = named
            .get(&off)
            .map(|s| s.to_string())
            .unwrap_or_else(|| format!("<|reserved_token_{id}|>"));
        decoder.insert(
            id.to_string(),
            serde_json::json!({"content": content, "lstrip": false, "normalized": false,
                "rstrip": false, "single_word": false, "special": true}),
        );
    }
    serde_json::json!({
        "added_tokens_decoder": decoder,
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "model_max_length": 1048576,
        "tokenizer_class": "TikTokenTokenizer"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_valid_bpe() {
        let r = train_ranks(200);
        assert!(r.len() > 300, "{}", r.len());
        assert_eq!(r[65], b"A");
        let mut seen = std::collections::HashSet::new();
        for t in &r {
            assert!(seen.insert(t.clone()), "duplicate token");
        }
        // deterministic
        assert_eq!(r, train_ranks(200));
    }
}
