use super::super::tests::fixture_tok;
use super::*;
use crate::chat::{
    encode_segments, render_conversation, ChatOptions, ChatSplitter, Delta, Message,
};
use crate::checkpoint::rng::Rng;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use serde_json::{json, Value};

/// A random JSON value: nested objects and arrays, quotes, backslashes, unicode, markers
/// spelled in ordinary text, numbers of every form.
fn value(r: &mut Rng, depth: u32) -> Value {
    let strings = [
        "Tokyo",
        "say \"hi\" & <b>bye</b>",
        "back\\slash\nnew line\ttab",
        "héllo 漢字 🦀",
        "<|close|>argument<|sep|> is only text",
        "",
        "  padded  ",
    ];
    match r.below(if depth == 0 { 5 } else { 7 }) {
        0 => json!(strings[r.below(strings.len() as u64) as usize]),
        1 => json!(r.below(2000) as i64 - 1000),
        2 => json!((r.uniform() - 0.5) * 1e6),
        3 => json!(r.below(2) == 0),
        4 => Value::Null,
        5 => Value::Array((0..r.below(4)).map(|_| value(r, depth - 1)).collect()),
        _ => Value::Object(
            (0..r.below(4))
                .map(|i| (format!("k{i}_{}", r.below(100)), value(r, depth - 1)))
                .collect(),
        ),
    }
}

/// Calls with 1 to 4 arguments in a random written order (not sorted: the order must survive).
fn calls(r: &mut Rng) -> Vec<ToolCall> {
    let names = ["get_weather", "search", "run_code", "a\"b&c"];
    (0..1 + r.below(4))
        .map(|i| {
            let n = r.below(5);
            let args: Vec<String> = (0..n)
                .map(|j| {
                    let key = format!("{}{j}", ["z", "a", "m", "ключ"][r.below(4) as usize]);
                    format!("{}: {}", json!(key), value(r, 2))
                })
                .collect();
            ToolCall {
                id: format!("call_{i}"),
                name: names[r.below(names.len() as u64) as usize].into(),
                arguments: format!("{{ {} }}", args.join(", ")),
            }
        })
        .collect()
}

/// The assistant turn as the model would write it: rendered, encoded, then fed back one token
/// at a time through the splitter.
fn replay(tok: &Tokenizer, m: &Message) -> (String, String, Vec<ToolCall>) {
    let opts = ChatOptions {
        tools: Some(json!([])),
        ..Default::default()
    };
    let all = encode_segments(
        tok,
        &render_conversation(std::slice::from_ref(m), &opts).unwrap(),
    );
    let head = encode_segments(tok, &render_conversation(&[], &opts).unwrap()).len();
    // Skip `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`: the generation prompt.
    let prompt = crate::chat::render_continuation(&[], &opts).unwrap();
    let skip = head + encode_segments(tok, &prompt).len();
    let mut s = ChatSplitter::new(true).with_tools(true);
    let mut dec = StreamDecoder::new();
    let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::new());
    let mut take = |d: Vec<Delta>| {
        for x in d {
            match x {
                Delta::Reasoning(t) => r.push_str(&t),
                Delta::Content(t) => c.push_str(&t),
                Delta::ToolCall(t) => calls.push(t),
            }
        }
    };
    for &id in &all[skip..] {
        take(s.push_id(tok, &mut dec, id));
    }
    take(s.push(&dec.finish()));
    take(s.finish());
    assert!(s.done());
    (r, c, calls)
}

fn keys(args: &str) -> Vec<String> {
    ordered_members(args)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn parse_of_render_is_the_identity_on_generated_calls() {
    let tok = fixture_tok();
    let mut r = Rng::new(32);
    for case in 0..60 {
        let mut m = Message::new("assistant", ["", "Let me check.", "a & b \"c\""][case % 3]);
        m.reasoning_content = Some("thinking about tools".into());
        m.tool_calls = calls(&mut r);
        let (reasoning, content, got) = replay(&tok, &m);
        assert_eq!(reasoning, "thinking about tools");
        assert_eq!(content, m.content, "case {case}");
        assert_eq!(got.len(), m.tool_calls.len(), "case {case}");
        for (g, w) in got.iter().zip(&m.tool_calls) {
            assert_eq!(g.name, w.name);
            let (gv, wv): (Value, Value) = (
                serde_json::from_str(&g.arguments).unwrap(),
                serde_json::from_str(&w.arguments).unwrap(),
            );
            assert_eq!(gv, wv, "case {case}: {}", w.arguments);
            assert_eq!(keys(&g.arguments), keys(&w.arguments), "order, case {case}");
        }
    }
}

#[test]
fn arguments_that_are_not_an_object_stay_text_and_never_panic() {
    let tok = fixture_tok();
    for args in ["[1, 2]", "{oops", "\"just a string\"", "", "{\"a\": }"] {
        let mut m = Message::new("assistant", "x");
        m.tool_calls = vec![ToolCall {
            id: "c".into(),
            name: "f".into(),
            arguments: args.into(),
        }];
        let (_, content, got) = replay(&tok, &m);
        assert!(got.is_empty(), "{args}");
        assert!(
            content.starts_with('x') && content.contains("call tool=\"f\""),
            "{content}"
        );
    }
}

#[test]
fn a_json_block_wins_and_malformed_calls_become_content() {
    let tok = fixture_tok();
    let sp = |t: &str| tok.encode(t, true);
    let ids: Vec<u32> = [
        "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"b\": [1, {\"c\": null}]}<|close|>json<|sep|><|close|>call<|sep|>",
        "<|open|>call index=\"2\"<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"g\"<|sep|><|open|>argument type=\"string\"<|sep|>v<|close|>argument<|sep|><|close|>call<|sep|>",
        "<|open|>call tool=\"h\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>not json<|close|>argument<|sep|><|close|>call<|sep|>",
        "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
    ]
    .iter()
    .flat_map(|t| sp(t))
    .collect();
    let mut s = ChatSplitter::new(false).with_tools(true);
    let mut dec = StreamDecoder::new();
    let mut out = s.push_token("", 0);
    for t in sp("ok<|close|>response<|sep|><|open|>tools<|sep|>")
        .into_iter()
        .chain(ids)
    {
        out.extend(s.push_id(&tok, &mut dec, t));
    }
    out.extend(s.finish());
    let calls: Vec<_> = out
        .iter()
        .filter_map(|d| match d {
            Delta::ToolCall(c) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(
        (calls[0].name.as_str(), calls[0].arguments.as_str()),
        ("f", "{\"b\":[1,{\"c\":null}]}")
    );
    // A value of a non-string type that is not JSON is kept as a string (as mlx-lm does).
    assert_eq!(
        (calls[1].name.as_str(), calls[1].arguments.as_str()),
        ("h", "{\"n\":\"not json\"}")
    );
    let text: String = out
        .iter()
        .filter_map(|d| match d {
            Delta::Content(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.starts_with("ok<|open|>call index=\"2\""), "{text}");
    assert!(
        text.contains("<|open|>argument type=\"string\"<|sep|>v"),
        "{text}"
    );
}

#[test]
fn a_section_cut_short_is_content_and_without_tools_it_stays_text() {
    let tok = fixture_tok();
    let text = "ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\"<|sep|>1";
    for tools in [true, false] {
        let mut s = ChatSplitter::new(false).with_tools(tools);
        let mut dec = StreamDecoder::new();
        let mut out = Vec::new();
        for id in tok.encode(text, true) {
            out.extend(s.push_id(&tok, &mut dec, id));
        }
        out.extend(s.finish());
        let all: String = out
            .iter()
            .map(|d| match d {
                Delta::Content(t) => t.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        let want = if tools {
            "ok<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\"<|sep|>1"
        } else {
            text
        };
        assert_eq!(all, want);
    }
}

#[test]
fn tool_messages_take_their_call_and_choices_render() {
    let mut a = Message::new("assistant", "");
    a.tool_calls = vec![
        ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        },
        ToolCall {
            id: "c2".into(),
            name: "g".into(),
            arguments: "{\"x\":1}".into(),
        },
    ];
    let mut t2 = Message::new("tool", "two");
    t2.tool_call_id = Some("c2".into());
    let mut t1 = Message::new("tool", "one");
    t1.tool_call_id = Some("c1".into());
    let opts = ChatOptions {
        thinking: false,
        tools: Some(json!([{"type": "function", "function": {"name": "f"}}])),
        tool_choice: ToolChoice::Function("g".into()),
        parallel_tool_calls: false,
        ..Default::default()
    };
    let t = crate::chat::segments_text(
        &crate::chat::render(&[Message::new("user", "u"), a, t2, t1], &opts).unwrap(),
    );
    assert!(t.contains("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"x\" type=\"integer\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>"), "{t}");
    assert!(t.contains(
        "<|open|>message role=\"tool\" tool=\"g\" index=\"2\"<|sep|>two<|close|>message<|sep|>"
    ));
    assert!(t.contains("<|open|>message role=\"tool\" tool=\"f\" index=\"1\"<|sep|>one"));
    assert!(t.contains("type=\"tool-choice\"<|sep|>Call the tool `g` in this reply.\nCall at most one tool in this reply.<|close|>"));
    let mut stray = Message::new("tool", "?");
    stray.tool_call_id = Some("nope".into());
    let err = crate::chat::render(&[stray], &opts)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`nope`"), "{err}");
}

/// Hand-written sections: malformed calls and the forms a model may write loosely.
const LOOSE: &[&str] = &[
    "<|open|>call index=\"1\"<|sep|><|open|>argument key=\"a\"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>json type=\"object\"<|sep|>[1, 2]<|close|>json<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>json type=\"object\"<|sep|>{oops<|close|>json<|sep|><|close|>call<|sep|><|open|>call tool=\"g\"<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument type=\"string\"<|sep|>v<|close|>argument<|sep|><|close|>call<|sep|>",
    "\n<|open|>call tool=\"f\" index=\"1\"<|sep|>\n  <|open|>argument key=\"a\" type=\"string\"<|sep|>x<|close|>argument<|sep|>\n  stray words\n  <|open|>argument key=\"b\" type=\"boolean\"<|sep|>true<|close|>argument<|sep|>\n<|close|>call<|sep|>\n",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"integer\"<|sep|>1<|close|>argument<|sep|><|open|>json type=\"object\"<|sep|>{\"z\": 2}<|close|>json<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>not a number<|close|>argument<|sep|><|open|>argument key=\"n2\" type=\"number\"<|sep|> 2.5e3 <|close|>argument<|sep|><|close|>call<|sep|>",
    "",
    "<|open|>call tool=\"q&quot;x&amp;y\"<|sep|><|open|>argument key=\"k&quot;\"<|sep|>&amp;<|close|>argument<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"a\" type=\"string\"<|sep|>1<|close|>argument<|sep|><|open|>argument key=\"a\" type=\"integer\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"empty\" type=\"string\"<|sep|><|close|>argument<|sep|><|close|>call<|sep|>",
    "<|open|>call tool=\"f\"<|sep|><|open|>argument key=\"untyped\"<|sep|>42<|close|>argument<|sep|><|open|>argument key=\"list\" type=\"array\"<|sep|>[1, \"two\"]<|close|>argument<|sep|><|close|>call<|sep|>",
];

/// The section text after `<|open|>tools<|sep|>` fed through the splitter; the calls it gives.
fn parse_section(tok: &Tokenizer, section: &str) -> Vec<ToolCall> {
    let text = format!("x<|close|>response<|sep|><|open|>tools<|sep|>{section}<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>");
    let mut s = ChatSplitter::new(false).with_tools(true);
    let mut dec = StreamDecoder::new();
    let mut out = Vec::new();
    for id in tok.encode(&text, true) {
        out.extend(s.push_id(tok, &mut dec, id));
    }
    out.extend(s.finish());
    out.into_iter()
        .filter_map(|d| match d {
            Delta::ToolCall(c) => Some(c),
            _ => None,
        })
        .collect()
}

/// Writes the corpus `scripts/tool_parser_check.py` gives mlx-lm's kimi_k3 parser: generated
/// turns and `LOOSE`, each its tools section's text and the calls this parser found. Run by
/// the script: `DELTAFIN_TOOL_CORPUS=FILE cargo test --release --lib -- --ignored
/// write_tool_corpus`.
#[test]
#[ignore]
fn write_tool_corpus() {
    let path = std::env::var("DELTAFIN_TOOL_CORPUS").expect("DELTAFIN_TOOL_CORPUS=FILE");
    let tok = fixture_tok();
    let mut r = Rng::new(7);
    let mut lines = Vec::new();
    let mut sections: Vec<String> = LOOSE.iter().map(|s| s.to_string()).collect();
    while sections.len() < LOOSE.len() + 200 {
        let m = Message {
            tool_calls: calls(&mut r),
            ..Message::new("assistant", "")
        };
        // A marker spelled in ordinary text is text here and structure to a text parser: the
        // one intended difference, left out of the comparison.
        if m.tool_calls.iter().any(|c| c.arguments.contains("<|")) {
            continue;
        }
        let mut segs = Vec::new();
        render_calls(&mut segs, &m.tool_calls);
        let t = crate::chat::segments_text(&segs);
        sections.push(
            t["<|open|>tools<|sep|>".len()..t.len() - "<|close|>tools<|sep|>".len()].to_string(),
        );
    }
    for s in &sections {
        let calls: Vec<Value> = parse_section(&tok, s)
            .into_iter()
            // The arguments' text as it is (Python parses it: f64 via serde_json could move a
            // last digit).
            .map(|c| json!({"name": c.name, "arguments": c.arguments}))
            .collect();
        lines.push(json!({"text": s, "calls": calls}).to_string());
    }
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    eprintln!("{} sections written to {path}", lines.len());
}
