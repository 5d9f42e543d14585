//! Training a tokenizer in K3's format with the `tokenizers` crate: byte-level BPE over K3's split
//! pattern (the same pre-tokenizer `hf::build` uses), every byte in the initial alphabet, so the
//! result is a tiktoken rank list (`tiktoken.model`): a token's rank is the order the trainer made
//! it, which is the order tiktoken's rule merges by. Writing the files is the caller's.

use std::path::Path;

use tokenizers::models::bpe::BpeTrainer;
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

use super::hf::{build, byte_chars};
use crate::{Error, Result};

/// BPE ranks (`vocab` of them, the 256 bytes first) trained on the text files `files`, split by
/// `pattern`.
pub fn train_ranks(files: &[&Path], vocab: usize, pattern: &str) -> Result<Vec<Vec<u8>>> {
    train(files, vocab, pattern).map(|(ranks, _)| ranks)
}

/// `train_ranks`, with the trainer's own tokenizer (ids = ranks).
fn train(
    files: &[&Path],
    vocab: usize,
    pattern: &str,
) -> Result<(Vec<Vec<u8>>, tokenizers::Tokenizer)> {
    if vocab < 257 {
        return Err(Error::Msg(format!(
            "a byte-level BPE needs more than the 256 byte tokens; asked for {vocab}"
        )));
    }
    let mut tk = build(&[], pattern)?;
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(vocab)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let names: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    tk.train_from_files(&mut trainer, names)
        .map_err(|e| Error::Msg(format!("training the tokenizer: {e}")))?;
    let mut by_id: Vec<(u32, String)> = tk
        .get_vocab(false)
        .into_iter()
        .map(|(s, i)| (i, s))
        .collect();
    by_id.sort();
    let table = byte_chars();
    let byte_of = |c: char| table.iter().position(|&t| t == c).map(|b| b as u8);
    let mut ranks = Vec::with_capacity(by_id.len());
    for (want, (id, s)) in by_id.into_iter().enumerate() {
        if id as usize != want {
            return Err(Error::Msg(format!(
                "trained ids are not contiguous at {want}"
            )));
        }
        let bytes = s
            .chars()
            .map(|c| byte_of(c).ok_or_else(|| Error::Msg(format!("token {s:?} is not byte-level"))))
            .collect::<Result<Vec<u8>>>()?;
        ranks.push(bytes);
    }
    if ranks.iter().filter(|r| r.len() == 1).count() != 256 {
        return Err(Error::Msg(
            "the trained vocabulary lacks some single bytes".into(),
        ));
    }
    Ok((ranks, tk))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{Tokenizer, TIKTOKEN_PATTERN};

    /// Ranks trained on the held-out novel's first 200 KB: the trainer's own tokenizer and ours
    /// (tiktoken's rule over the ranks) encode the text the same, and it decodes back.
    #[test]
    fn trained_ranks_encode_as_the_trainer_does() {
        let text: String = include_str!("../../data/heldout/persuasion.txt")
            .chars()
            .take(200_000)
            .collect();
        let dir = std::env::temp_dir().join(format!("deltafin-train-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("t.txt");
        std::fs::write(&f, &text).unwrap();
        let (ranks, trained) = train(&[&f], 1000, TIKTOKEN_PATTERN).unwrap();
        assert_eq!(ranks.len(), 1000);
        let ours = Tokenizer::new(ranks.clone(), vec![], TIKTOKEN_PATTERN).unwrap();
        let ids = ours.encode_ordinary(&text);
        let theirs = trained
            .encode(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(
            ids, theirs,
            "tiktoken's rule over the ranks differs from the trainer's merges"
        );
        assert_eq!(ours.decode(&ids), text);
        // Merges learned: far fewer tokens than bytes.
        assert!(
            ids.len() * 2 < text.len(),
            "{} tokens for {} bytes",
            ids.len(),
            text.len()
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
