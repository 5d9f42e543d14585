use super::*;
use crate::checkpoint::tiktoken_fixture::train_ranks;

fn fixture_tok() -> Tokenizer {
    let ranks = train_ranks(240);
    let n = ranks.len() as u32;
    let specials = vec![
        ("[BOS]".to_string(), n),
        ("<|end_of_msg|>".to_string(), n + 2),
        ("<|open|>".to_string(), n + 3),
    ];
    Tokenizer::new(ranks, specials, TIKTOKEN_PATTERN).unwrap()
}

/// The pieces the pipeline's pre-tokenizer (K3's split pattern) cuts `s` into.
fn pieces(t: &Tokenizer, s: &str) -> Vec<String> {
    use tokenizers::PreTokenizer;
    let mut p = tokenizers::PreTokenizedString::from(s);
    t.hf.get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut p)
        .unwrap();
    p.get_splits(
        tokenizers::OffsetReferential::Original,
        tokenizers::OffsetType::Byte,
    )
    .into_iter()
    .map(|(_, (a, b), _)| s[a..b].to_string())
    .collect()
}

/// Rank of each token's bytes.
fn rank_map(t: &Tokenizer) -> HashMap<Vec<u8>, u32> {
    t.tokens
        .iter()
        .enumerate()
        .map(|(i, b)| (b.clone(), i as u32))
        .collect()
}

#[test]
fn k3_split_rule_hand_checked() {
    let t = fixture_tok();
    let cases: &[(&str, &[&str])] = &[
        (
            "The capital of France is",
            &["The", " capital", " of", " France", " is"],
        ),
        ("Hello\n\nworld  ", &["Hello", "\n\n", "world", "  "]),
        ("a  b", &["a", " ", " b"]),
        ("x\n\n  y", &["x", "\n\n", " ", " y"]),
        ("北京是中国的首都。", &["北京是中国的首都", "。"]),
        ("I'm HELLO's", &["I'm", " HELLO's"]),
        ("12345", &["123", "45"]),
        ("a <|open|> b", &["a", " <|", "open", "|>", " b"]),
        ("fn main() {}", &["fn", " main", "()", " {}"]),
        ("tab\there", &["tab", "\there"]),
    ];
    for (text, want) in cases {
        assert_eq!(pieces(&t, text), *want, "{text:?}");
    }
}

/// A plain reference of tiktoken's rule: merge the lowest-ranked adjacent pair, leftmost first.
fn reference_bpe(t: &Tokenizer, piece: &[u8]) -> Vec<u32> {
    let ranks = rank_map(t);
    if let Some(&r) = ranks.get(piece) {
        return vec![r];
    }
    let mut parts: Vec<Vec<u8>> = piece.iter().map(|b| vec![*b]).collect();
    loop {
        let mut best: Option<(u32, usize)> = None;
        for i in 0..parts.len().saturating_sub(1) {
            let m: Vec<u8> = parts[i].iter().chain(&parts[i + 1]).copied().collect();
            if let Some(&r) = ranks.get(&m) {
                if best.map(|(br, _)| r < br).unwrap_or(true) {
                    best = Some((r, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = parts.remove(i + 1);
        parts[i].extend(right);
    }
    parts.iter().map(|p| ranks[p]).collect()
}

#[test]
fn bpe_matches_reference_and_round_trips() {
    let t = fixture_tok();
    let texts = [
        "The capital of France is Paris. The Eiffel Tower is located in Paris.",
        "Streaming experts from the disk keeps the memory small!!  \n\n\tOK",
        "Les élèves étudient à l'école. 北京是中国的首都。 🙂🙃 12345678",
        "",
        "    leading spaces and trailing   ",
    ];
    for text in texts {
        let ids = t.encode_ordinary(text);
        assert_eq!(t.decode(&ids), text);
        let mut want = Vec::new();
        for p in pieces(&t, text) {
            want.extend(reference_bpe(&t, p.as_bytes()));
        }
        assert_eq!(ids, want, "{text:?}");
    }
}

#[test]
fn specials_only_when_allowed() {
    let t = fixture_tok();
    let n = t.num_ranks();
    let with = t.encode("a <|open|> b [BOS] c", true);
    assert!(with.contains(&(n + 3)) && with.contains(&n));
    assert_eq!(t.decode(&with), "a <|open|> b [BOS] c");
    let without = t.encode("a <|open|> b [BOS] c", false);
    assert!(
        without.iter().all(|&i| i < n),
        "user text never yields special ids"
    );
    assert_eq!(t.decode(&without), "a <|open|> b [BOS] c");
    // The segments around a special are encoded separately.
    let ids = t.encode("ab<|open|>cd", true);
    let pos = ids.iter().position(|&i| i == n + 3).unwrap();
    assert_eq!(t.decode(&ids[..pos]), "ab");
    assert_eq!(t.decode(&ids[pos + 1..]), "cd");
    assert_eq!(t.special_id("<|end_of_msg|>"), Some(n + 2));
}

#[test]
fn stream_decoder_never_splits_a_code_point() {
    let t = fixture_tok();
    let text = "é北🙂x";
    // Force one byte per token.
    let ids: Vec<u32> = text.bytes().map(u32::from).collect();
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    for id in ids {
        let s = d.push(&t, id);
        assert!(!s.contains('\u{FFFD}'));
        out.push_str(&s);
    }
    out.push_str(&d.finish());
    assert_eq!(out, text);
    // A stray continuation byte is emitted as U+FFFD, not held forever.
    let mut d = StreamDecoder::new();
    assert_eq!(d.push(&t, 0x80), "\u{FFFD}");
    assert_eq!(d.push(&t, b'a' as u32), "a");
}

#[test]
fn safety_chunks_split_long_runs() {
    let s = " ".repeat(60_000) + "abc";
    let chunks = safety_chunks(&s);
    assert!(chunks.len() >= 3);
    assert_eq!(chunks.concat(), s);
    assert!(chunks
        .iter()
        .all(|c| c.chars().count() <= 25_000 || !c.starts_with(' ')));
}

#[test]
fn ranks_file_errors_name_the_line() {
    assert!(parse_ranks("QQ== 0\nnot-base64!! 1\n", "x")
        .unwrap_err()
        .to_string()
        .contains("line 2"));
    assert!(parse_ranks("QQ== 1\n", "x")
        .unwrap_err()
        .to_string()
        .contains("rank 0"));
}

/// K3's real layout (163,584 BPE ranks, specials from 163,584 with `<|end_of_msg|>` = 163,586,
/// a 163,840-token vocabulary): the files load from a model directory, named specials land at
/// their ids, text round-trips with the reference BPE's ids, and a config whose vocabulary is not
/// ranks + 256 is refused.
#[test]
fn real_size_vocabulary_from_dir() {
    use crate::checkpoint::tiktoken_fixture::{
        pad_ranks, tiktoken_model_text, tokenizer_config_json,
    };
    use crate::models::k3::fixture::full::{k3_config, K3_LAYERS, K3_RANKS};
    assert_eq!(K3_RANKS, 163_584);
    let ranks = pad_ranks(train_ranks(240), K3_RANKS, 3);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tiktoken.model"),
        tiktoken_model_text(&ranks),
    )
    .unwrap();
    let tc = tokenizer_config_json(K3_RANKS as u32);
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        serde_json::to_vec(&tc).unwrap(),
    )
    .unwrap();
    let mut config = k3_config(K3_LAYERS);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let t0 = std::time::Instant::now();
    let t = Tokenizer::from_dir(dir.path()).unwrap();
    eprintln!("163,584-rank tokenizer loaded in {:?}", t0.elapsed());
    assert_eq!(t.num_ranks(), 163_584);
    assert_eq!(t.special_id("[BOS]"), Some(163_584));
    assert_eq!(t.special_id("<|end_of_msg|>"), Some(163_586));
    assert_eq!(t.special_id("[PAD]"), Some(163_839));
    assert_eq!(config["eos_token_id"], 163_586);
    let s = "The quick brown fox jumps over 13 lazy dogs. Ünïcode 北京 🙂";
    let ids = t.encode_ordinary(s);
    assert_eq!(t.decode(&ids), s);
    let mut want = Vec::new();
    for p in pieces(&t, s) {
        want.extend(reference_bpe(&t, p.as_bytes()));
    }
    assert_eq!(ids, want);
    let with = t.encode("[BOS]hi<|end_of_msg|>", true);
    assert_eq!(with.first(), Some(&163_584));
    assert_eq!(with.last(), Some(&163_586));
    // K3's family loads it the same, and refuses a vocabulary that is not ranks + 256.
    use crate::runtime::family::ModelFamily;
    let k3 = &crate::models::k3::family::K3;
    assert_eq!(k3.tokenizer(dir.path()).unwrap().num_ranks(), 163_584);
    config["text_config"]["vocab_size"] = (163_840 + 256).into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let e = k3.tokenizer(dir.path()).err().unwrap().to_string();
    assert!(e.contains("vocab_size") && e.contains("163584"), "{e}");
}

/// tiktoken's merge rule as written there: rescan every pair per merge (the reference).
fn merge_reference(ranks: &HashMap<Vec<u8>, u32>, piece: &[u8]) -> Vec<usize> {
    let mut bounds: Vec<usize> = (0..=piece.len()).collect();
    loop {
        let mut best: Option<(u32, usize)> = None;
        for i in 0..bounds.len().saturating_sub(2) {
            if let Some(&r) = ranks.get(&piece[bounds[i]..bounds[i + 2]]) {
                if best.is_none_or(|(br, _)| r < br) {
                    best = Some((r, i));
                }
            }
        }
        match best {
            Some((_, i)) => {
                bounds.remove(i + 1);
            }
            None => return bounds,
        }
    }
}

/// The `tokenizers` BPE gives tiktoken's result (whole piece if ranked, else the reference's
/// merges, ties leftmost) on random pieces, in time linear in a single piece's length.
#[test]
fn bpe_equals_tiktoken_rule_and_bounds_its_pieces() {
    // One piece per input: a pattern that matches everything.
    let t = Tokenizer::new(train_ranks(240), vec![], r"[\s\S]+")
        .unwrap()
        .with_safety_split(false);
    let ranks = rank_map(&t);
    let mut rng = crate::checkpoint::rng::Rng::new(5);
    let alphabet = b"the quick brown fox aeiou    stttt";
    for n in [0usize, 1, 2, 3, 5, 8, 13, 40, 200, 1000] {
        for _ in 0..20 {
            let piece: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let want: Vec<u32> = match ranks.get(&piece) {
                Some(&r) => vec![r],
                None => merge_reference(&ranks, &piece)
                    .windows(2)
                    .map(|w| ranks[&piece[w[0]..w[1]]])
                    .collect(),
            };
            let text = String::from_utf8(piece).unwrap();
            assert_eq!(t.encode_ordinary(&text), want, "{text:?}");
        }
    }
    // A long single piece (where a merge loop's cost grows with the piece) reaches the BPE in
    // runs of at most 25,000 characters, as tiktoken splits it: the cost is bounded by
    // construction. Checked on the chunks, not by a timing a slow or emulated machine fails.
    let big = "a".repeat(1 << 20);
    let chunks = super::safety_chunks(&big);
    assert!(
        chunks.len() >= (1 << 20) / 25_000,
        "{} chunks",
        chunks.len()
    );
    assert!(chunks.iter().all(|c| c.chars().count() <= 25_000));
    assert_eq!(chunks.concat(), big);
    let split = Tokenizer::new(train_ranks(240), vec![], r"[\s\S]+").unwrap();
    assert_eq!(split.decode(&split.encode_ordinary(&big)), big);
}
