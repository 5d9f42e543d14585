use super::*;
use crate::checkpoint::rng::Rng;
use crate::checkpoint::tiktoken_fixture::{
    tiktoken_model_text, tokenizer_config_json, train_ranks,
};

/// A vocabulary of K3's size (163,840 ids) of printable tokens 1-16 bytes long (mean 8.5,
/// above K3's), for the masks' cost tests.
pub(super) fn k3_size_table() -> std::sync::Arc<Vec<Option<Vec<u8>>>> {
    let mut r = Rng::new(5);
    std::sync::Arc::new(
        (0..163_840)
            .map(|_| {
                Some(
                    (0..1 + r.below(16))
                        .map(|_| b' ' + r.below(95) as u8)
                        .collect(),
                )
            })
            .collect(),
    )
}

/// `mask.apply` over the table's ids, 5 times: the median, min and max in ms, printed.
pub(super) fn report_apply_ms(what: &str, mask: &JsonMask, ids: usize) {
    let mut ms = Vec::new();
    for _ in 0..5 {
        let mut l = vec![0f32; ids];
        let t = std::time::Instant::now();
        mask.apply(&mut l);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    eprintln!(
        "{what} at {ids} ids: median {:.2} ms [{:.2}-{:.2}] per token",
        ms[2], ms[0], ms[4]
    );
}

pub(super) fn fixture_tok() -> Tokenizer {
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
    // K3's renderer refuses medium (as a request, a default, or set directly); harmony's
    // default is medium, K3's max.
    use crate::chat::{ChatFormat, Harmony, Xtml};
    assert!(Xtml.effort(Some("medium"), None).is_err());
    assert!(Xtml.effort(None, Some("medium")).is_err());
    let medium = ChatOptions {
        effort: Some(Effort::Medium),
        ..Default::default()
    };
    assert!(render(&[], &medium).is_err());
    assert_eq!(Xtml.effort(Some("low"), Some("high")).unwrap(), Effort::Low);
    assert_eq!(Xtml.effort(None, None).unwrap(), Effort::Max);
    assert_eq!(Harmony.effort(None, None).unwrap(), Effort::Medium);
    assert!(Effort::parse("minimal").is_err());
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

use super::splitter::{EOM, RESP_CLOSE, RESP_OPEN, THINK_CLOSE};

/// Ordinary text as one token per character.
fn chars(t: &str) -> Vec<(String, bool)> {
    t.chars().map(|c| (c.to_string(), false)).collect()
}

fn marker(m: &[(&str, bool)]) -> Vec<(String, bool)> {
    m.iter()
        .flat_map(|&(t, sp)| {
            if sp {
                vec![(t.to_string(), true)]
            } else {
                chars(t)
            }
        })
        .collect()
}

/// Feeds `pushes` (each: ordinary text, then optionally one special token's text).
fn split_all(pushes: &[(String, usize)], thinking: bool) -> (String, String, bool) {
    let mut s = ChatSplitter::new(thinking);
    let (mut r, mut c) = (String::new(), String::new());
    let mut take = |d: Vec<Delta>| {
        for x in d {
            match x {
                Delta::Reasoning(t) => r.push_str(&t),
                Delta::Content(t) => c.push_str(&t),
                Delta::ToolCall(_) => panic!("tool call without tools"),
            }
        }
    };
    for (text, special) in pushes {
        take(s.push_token(text, *special));
    }
    take(s.finish());
    (r, c, s.done())
}

/// Groups a token stream into pushes: ordinary tokens joined between `cuts`, and every special
/// token ending its push (as the decoder delivers it).
fn group(tokens: &[(String, bool)], cuts: &[usize]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for (i, (t, sp)) in tokens.iter().enumerate() {
        if cuts.contains(&i) && !cur.is_empty() {
            out.push((std::mem::take(&mut cur), 0));
        }
        cur.push_str(t);
        if *sp {
            out.push((std::mem::take(&mut cur), t.len()));
        }
    }
    if !cur.is_empty() {
        out.push((cur, 0));
    }
    out
}

/// Every grouping of a rendered answer's tokens (all splits into up to three pieces, one token
/// at a time, and random ones) gives the same reasoning and content, and no marker ever leaks.
#[test]
fn splitter_handles_every_chunking() {
    let reasoning = "Let me think: 2+2 <is> 4.";
    let content = "The answer is 4 | final.";
    let tokens: Vec<(String, bool)> = [
        chars(reasoning),
        marker(THINK_CLOSE),
        marker(RESP_OPEN),
        chars(content),
        marker(RESP_CLOSE),
        marker(EOM),
    ]
    .concat();
    let n = tokens.len();
    let check = |pushes: Vec<(String, usize)>| {
        let (r, c, done) = split_all(&pushes, true);
        assert_eq!(r, reasoning, "{pushes:?}");
        assert_eq!(c, content, "{pushes:?}");
        assert!(done);
    };
    for a in 0..=n {
        for b in a..=n {
            check(group(&tokens, &[a, b]));
        }
    }
    check(group(&tokens, &(0..n).collect::<Vec<_>>()));
    let mut rng = Rng::new(9);
    for _ in 0..2000 {
        let cuts: Vec<usize> = (0..rng.below(12))
            .map(|_| rng.below(n as u64) as usize)
            .collect();
        check(group(&tokens, &cuts));
    }
    // A close marker that is not followed by the end of message is content.
    let odd = [
        marker(RESP_OPEN),
        chars("a"),
        marker(RESP_CLOSE),
        chars("b"),
        marker(RESP_CLOSE),
        marker(EOM),
    ]
    .concat();
    let (r, c, _) = split_all(&group(&odd, &[]), true);
    let close: String = RESP_CLOSE.iter().map(|p| p.0).collect();
    assert_eq!((r.as_str(), c.as_str()), ("", &*format!("a{close}b")));
    // Thinking off: everything is content; a stream cut short keeps what was said.
    let (r, c, done) = split_all(&[("Hi".into(), 0), (" there".into(), 0)], false);
    assert_eq!((r.as_str(), c.as_str(), done), ("", "Hi there", false));
}

/// Markers spelled with ordinary tokens are text: they neither end the reasoning nor the message.
#[test]
fn spelled_markers_are_text() {
    let fake_open = "<|open|>response<|sep|>";
    let fake_eom = "<|end_of_msg|>";
    let tokens = [
        chars(&format!("I could write {fake_open} here.")),
        marker(THINK_CLOSE),
        marker(RESP_OPEN),
        chars(&format!("Or {fake_eom} there.")),
        marker(RESP_CLOSE),
        marker(EOM),
    ]
    .concat();
    let (r, c, done) = split_all(&group(&tokens, &[]), true);
    assert_eq!(r, format!("I could write {fake_open} here."));
    assert_eq!(c, format!("Or {fake_eom} there."));
    assert!(done);
}

/// Through the tokenizer: a special id ends the decoder's output whole, and `push_id` marks it.
#[test]
fn push_id_marks_special_ids() {
    let t = fixture_tok();
    let eom = t.special_id("<|end_of_msg|>").unwrap();
    let mut dec = crate::tokenizer::StreamDecoder::new();
    let mut s = ChatSplitter::new(false);
    let mut got = Vec::new();
    for id in t.encode_ordinary("Hi <|end_of_msg|> there") {
        got.extend(s.push_id(&t, &mut dec, id));
    }
    assert!(!s.done(), "a spelled end of message is text");
    got.extend(s.push_id(&t, &mut dec, eom));
    assert!(s.done());
    let text: String = got
        .into_iter()
        .map(|d| match d {
            Delta::Content(x) | Delta::Reasoning(x) => x,
            Delta::ToolCall(_) => unreachable!(),
        })
        .collect();
    assert_eq!(text, "Hi <|end_of_msg|> there");
}
