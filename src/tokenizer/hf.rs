//! K3's tokenizer as a `tokenizers::Tokenizer`: the tiktoken ranks become a byte-level BPE
//! vocabulary (each byte string spelled with the GPT-2 byte-to-character table) with merges
//! derived from the ranks, K3's split regex is a `Split` pre-tokenizer (`fancy-regex`), and the
//! specials are added tokens that `encode` never recognises in text (`encode_special_tokens`):
//! where a special may appear, the chat renderer emits its id directly. What `deltafin
//! export-tokenizer` writes as `tokenizer.json` is this object.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::{Error, Result};

/// GPT-2's byte-to-character table (what `tokenizers`' ByteLevel uses): printable Latin-1 bytes
/// stand for themselves, the others map to U+0100 onwards in byte order.
pub fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut n = 0;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    out
}

/// Token bytes by id, and `(text, id)` specials.
pub type VocabBytes = (Vec<Vec<u8>>, Vec<(String, u32)>);

/// A loaded byte-level BPE's ids as bytes (its vocabulary spelled in GPT-2's alphabet, ids
/// `0..n` contiguous) and its added tokens as `(text, id)` specials.
pub fn vocab_bytes(tk: &tokenizers::Tokenizer) -> std::result::Result<VocabBytes, String> {
    let table = byte_chars();
    let mut back = HashMap::new();
    for (b, c) in table.iter().enumerate() {
        back.insert(*c, b as u8);
    }
    let vocab = tk.get_vocab(false);
    let added = tk.get_added_tokens_decoder();
    let mut tokens: Vec<Option<Vec<u8>>> = vec![None; vocab.len()];
    for (s, &id) in &vocab {
        if added.contains_key(&id) {
            continue;
        }
        let bytes: Option<Vec<u8>> = s.chars().map(|c| back.get(&c).copied()).collect();
        let bytes = bytes.ok_or_else(|| {
            format!("token {id} ({s:?}) is not spelled in the byte-level alphabet (only byte-level BPE tokenizers are supported)")
        })?;
        match tokens.get_mut(id as usize) {
            Some(slot) => *slot = Some(bytes),
            None => {
                return Err(format!(
                    "token id {id} is past the {} vocabulary entries",
                    vocab.len()
                ))
            }
        }
    }
    let n = tokens
        .iter()
        .position(Option::is_none)
        .unwrap_or(tokens.len());
    if tokens[n..].iter().any(Option::is_some) {
        return Err(format!(
            "the vocabulary's ids are not contiguous (id {n} is missing)"
        ));
    }
    tokens.truncate(n);
    let mut specials: Vec<(String, u32)> = added
        .iter()
        .map(|(id, t)| (t.content.clone(), *id))
        .collect();
    specials.sort_by_key(|(_, id)| *id);
    if let Some((s, id)) = specials.iter().find(|(_, id)| (*id as usize) < n) {
        return Err(format!("added token {s:?} reuses vocabulary id {id}"));
    }
    Ok((tokens.into_iter().flatten().collect(), specials))
}

/// A byte string spelled in the byte-level alphabet.
fn spell(table: &[char; 256], bytes: &[u8]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// The merges that make tiktoken's ranks a BPE: for every token of two or more bytes, each split
/// into two tokens of lower rank, ordered by the merged token's rank (then the parts' ranks).
fn merges(tokens: &[Vec<u8>], ranks: &HashMap<&[u8], u32>) -> Vec<(u32, u32, u32)> {
    let mut out = Vec::new();
    for (rank, t) in tokens.iter().enumerate() {
        let rank = rank as u32;
        for i in 1..t.len() {
            if let (Some(&a), Some(&b)) = (ranks.get(&t[..i]), ranks.get(&t[i..])) {
                if a < rank && b < rank {
                    out.push((rank, a, b));
                }
            }
        }
    }
    out.sort_unstable();
    out
}

/// Builds the `tokenizers` pipeline from ranks and the split pattern (no specials: see
/// `with_specials`).
pub fn build(tokens: &[Vec<u8>], pattern: &str) -> Result<tokenizers::Tokenizer> {
    let err = |what: &str, e: &dyn std::fmt::Display| Error::Msg(format!("tokenizer {what}: {e}"));
    let table = byte_chars();
    let ranks: HashMap<&[u8], u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_slice(), i as u32))
        .collect();
    if ranks.len() != tokens.len() {
        return Err(Error::Msg(
            "tokenizer: two ranks hold the same bytes".into(),
        ));
    }
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (spell(&table, t), i as u32))
        .collect();
    let merges = merges(tokens, &ranks)
        .into_iter()
        .map(|(_, a, b)| {
            (
                spell(&table, &tokens[a as usize]),
                spell(&table, &tokens[b as usize]),
            )
        })
        .collect();
    // tiktoken looks a whole piece up before merging: `ignore_merges` does the same.
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(true)
        .build()
        .map_err(|e| err("model", &e))?;
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| err("split pattern", &e))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(Sequence::new(vec![
        split.into(),
        ByteLevel::new(false, false, false).into(),
    ])));
    tk.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    Ok(tk)
}

/// `tk` with the named specials as added tokens, each at its own id (they must follow the ranks
/// contiguously, as K3's 256 reserved ids do), never recognised in encoded text.
pub fn with_specials(
    mut tk: tokenizers::Tokenizer,
    specials: &[(String, u32)],
) -> Result<tokenizers::Tokenizer> {
    let mut named: Vec<&(String, u32)> = specials.iter().collect();
    named.sort_by_key(|(_, id)| *id);
    let added: Vec<AddedToken> = named
        .iter()
        .map(|(s, _)| AddedToken::from(s.clone(), true))
        .collect();
    tk.add_special_tokens(added)
        .map_err(|e| Error::Msg(format!("tokenizer specials: {e}")))?;
    for (s, id) in named {
        if tk.token_to_id(s) != Some(*id) {
            return Err(Error::Msg(format!(
                "tokenizer: special {s} should be id {id} (the ids after the ranks must be contiguous)"
            )));
        }
    }
    tk.set_encode_special_tokens(true);
    Ok(tk)
}
