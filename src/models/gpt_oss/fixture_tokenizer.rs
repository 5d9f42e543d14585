//! The gpt-oss fixtures' `tokenizer.json`: a small byte-level BPE trained on the built-in corpus
//! for the tiny shape (harmony's specials in its last 12 ids), or o200k_harmony's size and layout
//! for the published shapes (199,998 ranks, then the specials with harmony's at their published
//! ids). Written atomically; owns no model math.

use std::path::Path;

use crate::fsio::atomic::write_atomic;
use crate::{Error, Result};

use super::fixture::GptOssShape;

/// The shape's `tokenizer.json`: a small trained one up to 4,096 ids, else o200k_harmony's
/// layout at the shape's size.
pub fn write_tokenizer_json(dir: &Path, shape: &GptOssShape) -> Result<()> {
    if shape.vocab <= 4096 {
        write_tokenizer(dir, shape)
    } else {
        write_o200k_sized(dir, shape)
    }
}

/// A small vocabulary's `tokenizer.json`: byte-level BPE trained on the built-in corpus, o200k's
/// split pattern, harmony's specials in the last 12 ids (`<|return|>` the config's eos).
fn write_tokenizer(dir: &Path, shape: &GptOssShape) -> Result<()> {
    let first = shape.vocab as u32 - 12;
    use crate::checkpoint::tiktoken_fixture::{pad_ranks, train_ranks};
    let mut ranks = pad_ranks(train_ranks(first as usize - 256), first as usize, 1);
    ranks.truncate(first as usize);
    let names = [
        "<|start|>",
        "<|end|>",
        "<|message|>",
        "<|channel|>",
        "<|call|>",
        "<|constrain|>",
        "<|reserved_506|>",
        "<|reserved_507|>",
        "<|reserved_508|>",
        "<|startoftext|>",
        "<|endoftext|>",
        "<|return|>",
    ];
    let specials = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), first + i as u32))
        .collect();
    save_tokenizer(dir, ranks, specials)
}

fn save_tokenizer(dir: &Path, ranks: Vec<Vec<u8>>, specials: Vec<(String, u32)>) -> Result<()> {
    let tk = crate::tokenizer::Tokenizer::new(ranks, specials, super::tokenizer::O200K_PATTERN)?
        .to_hf()?;
    let text = tk
        .to_string(false)
        .map_err(|e| Error::Msg(format!("tokenizer.json: {e}")))?;
    write_atomic(&dir.join("tokenizer.json"), text.as_bytes())
}

/// o200k_harmony's layout at the shape's vocabulary (201,088 for gpt-oss): 199,998 byte-level
/// BPE ranks (trained merges, then distinct random tokens), then 1,090 specials with harmony's
/// at their published ids (`<|startoftext|>` 199998, `<|endoftext|>` 199999, `<|return|>`
/// 200002, `<|constrain|>` 200003, `<|channel|>` 200005, `<|start|>` 200006, `<|end|>`
/// 200007, `<|message|>` 200008, `<|call|>` 200012, `<|endofprompt|>` 200018) and the rest
/// `<|reserved_N|>`.
fn write_o200k_sized(dir: &Path, shape: &GptOssShape) -> Result<()> {
    use crate::checkpoint::tiktoken_fixture::{pad_ranks, train_ranks};
    const RANKS: usize = 199_998;
    if shape.vocab <= RANKS {
        return Err(Error::Msg(format!(
            "a vocabulary of {} ids is smaller than o200k's {RANKS} ranks",
            shape.vocab
        )));
    }
    let ranks = pad_ranks(train_ranks(1000), RANKS, 0x0200_0000);
    let named = [
        (0, "<|startoftext|>"),
        (1, "<|endoftext|>"),
        (4, "<|return|>"),
        (5, "<|constrain|>"),
        (7, "<|channel|>"),
        (8, "<|start|>"),
        (9, "<|end|>"),
        (10, "<|message|>"),
        (14, "<|call|>"),
        (20, "<|endofprompt|>"),
    ];
    let specials = (RANKS as u32..shape.vocab as u32)
        .map(|id| {
            let name = named
                .iter()
                .find(|(o, _)| RANKS as u32 + o == id)
                .map_or(format!("<|reserved_{id}|>"), |(_, n)| n.to_string());
            (name, id)
        })
        .collect();
    save_tokenizer(dir, ranks, specials)
}
