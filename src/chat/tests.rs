use super::*;
use crate::checkpoint::rng::Rng;
use crate::checkpoint::tiktoken_fixture::{
    tiktoken_model_text, tokenizer_config_json, train_ranks,
};

fn fixture_tok() -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    let ranks = train_ranks(240);
    std::fs::write(
        dir.path().join("tiktoken.model"),
        tiktoken_model_text(&ranks),
    )
    .unwrap();
    let cfg = tokenizer_config_json(ranks.len() as u32);
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    Tokenizer::from_dir(dir.path()).unwrap()
}

const EFFORT_TEXT: &str = "`thinking_effort` guides on how much to think in your thinking channel (not including the response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with `thinking_effort=max`.";

#[test]
fn renders_the_spec_example() {
    let segs = render(
        &[Message::new("user", "Hello <|open|> & goodbye")],
        &ChatOptions::default(),
    )
    .unwrap();
    assert_eq!(segs.len(), 38);
    let want = format!(
        "<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>{EFFORT_TEXT}<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"user\"<|sep|>Hello <|open|> & goodbye<|close|>message<|sep|><|end_of_msg|><|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"
    );
    assert_eq!(segments_text(&segs), want);
    let tok = fixture_tok();
    let ids = encode_segments(&tok, &segs);
    let open = tok.special_id("<|open|>").unwrap();
    // Four structural opens; the literal in the user's text is ordinary BPE.
    assert_eq!(ids.iter().filter(|&&i| i == open).count(), 4);
    assert_eq!(tok.decode(&ids), want);
    // Each segment is encoded on its own: the ids are the concatenation of per-segment ids.
    let mut per = Vec::new();
    for s in &segs {
        per.extend(encode_segments(&tok, std::slice::from_ref(s)));
    }
    assert_eq!(ids, per);
}

#[test]
fn attribute_values_are_escaped_and_history_renders() {
    let mut a = Message::new("assistant", "It is 4.");
    a.reasoning_content = Some("2+2".into());
    let mut u = Message::new("user", "a \"quoted\" & name");
    u.name = Some("Bob \"B\" & co".into());
    let t = segments_text(&render(&[u.clone(), a.clone()], &ChatOptions::default()).unwrap());
    assert!(t.contains("name=\"Bob &quot;B&quot; &amp; co\""));
    assert!(t.contains("a \"quoted\" & name"), "content is not escaped");
    assert!(t.contains("<|open|>think<|sep|>2+2<|close|>think<|sep|><|open|>response<|sep|>It is 4.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"));
    let off = ChatOptions {
        thinking: false,
        ..Default::default()
    };
    let t = segments_text(&render(&[u, a], &off).unwrap());
    assert!(!t.contains("think") && !t.contains("thinking-effort"));
    assert!(t.ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"));
    assert!(Effort::parse("medium").is_err());
    assert_eq!(Effort::resolve(Some("low")).unwrap(), Effort::Low);
    let tools = serde_json::json!([{"name": "f", "b": 1, "a": {"z": 1, "y": 2}}]);
    let t = segments_text(
        &render(
            &[],
            &ChatOptions {
                tools: Some(tools),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    assert!(
        t.contains("```json\n[{\"a\":{\"y\":2,\"z\":1},\"b\":1,\"name\":\"f\"}]\n```"),
        "{t}"
    );
}

fn split_all(chunks: &[&str], thinking: bool) -> (String, String, bool) {
    let mut s = ChatSplitter::new(thinking);
    let (mut r, mut c) = (String::new(), String::new());
    let mut take = |d: Vec<Delta>| {
        for x in d {
            match x {
                Delta::Reasoning(t) => r.push_str(&t),
                Delta::Content(t) => c.push_str(&t),
            }
        }
    };
    for ch in chunks {
        take(s.push(ch));
    }
    take(s.finish());
    (r, c, s.done())
}

/// Every chunking of a rendered answer (all splits into up to three pieces, one character at a
/// time, and random ones) gives the same reasoning and content, and no marker ever leaks.
#[test]
fn splitter_handles_every_chunking() {
    let reasoning = "Let me think: 2+2 <is> 4.";
    let content = "The answer is 4 | final.";
    let full = format!("{reasoning}{THINK_CLOSE}{RESP_OPEN}{content}{RESP_CLOSE}{EOM}");
    let chars: Vec<usize> = full
        .char_indices()
        .map(|(i, _)| i)
        .chain([full.len()])
        .collect();
    let check = |chunks: Vec<&str>| {
        let (r, c, done) = split_all(&chunks, true);
        assert_eq!(r, reasoning, "{chunks:?}");
        assert_eq!(c, content, "{chunks:?}");
        assert!(done);
    };
    for (ai, &a) in chars.iter().enumerate() {
        for &b in &chars[ai..] {
            check(vec![&full[..a], &full[a..b], &full[b..]]);
        }
    }
    check(
        full.char_indices()
            .map(|(i, ch)| &full[i..i + ch.len_utf8()])
            .collect(),
    );
    let mut rng = Rng::new(9);
    for _ in 0..2000 {
        let mut cuts: Vec<usize> = (0..rng.below(12))
            .map(|_| chars[rng.below(chars.len() as u64) as usize])
            .collect();
        cuts.sort();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut last = 0;
        for c in cuts.into_iter().chain([full.len()]) {
            pieces.push(&full[last..c]);
            last = c;
        }
        check(pieces);
    }
    // A close marker that is not followed by the end of message is content.
    let odd = format!("{RESP_OPEN}a{RESP_CLOSE}b{RESP_CLOSE}{EOM}");
    let (r, c, _) = split_all(&[&odd], true);
    assert_eq!((r.as_str(), c.as_str()), ("", &*format!("a{RESP_CLOSE}b")));
    // Thinking off: everything is content; a stream cut short keeps what was said.
    let (r, c, done) = split_all(&["Hi", " there"], false);
    assert_eq!((r.as_str(), c.as_str(), done), ("", "Hi there", false));
}
