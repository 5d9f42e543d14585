//! Harmony rendering and reply splitting, checked against the published layout.
use super::*;

use crate::chat::segments_text as flat;

#[test]
fn civil_dates() {
    assert_eq!(civil_date(0), "1970-01-01");
    assert_eq!(civil_date(951_782_400), "2000-02-29");
    assert_eq!(civil_date(1_796_428_799), "2026-12-04");
    assert_eq!(civil_date(1_796_428_800), "2026-12-05");
}

#[test]
fn renders_the_published_layout() {
    let msgs = vec![
        Message::new("system", "Answer briefly."),
        Message::new("user", "Hi"),
        Message {
            reasoning_content: Some("dropped".into()),
            ..Message::new("assistant", "Hello!")
        },
        Message::new("user", "2+2?"),
    ];
    let opts = HarmonyOptions {
        date: "2026-12-04".into(),
        reasoning: Reasoning::High,
        ..Default::default()
    };
    let want = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2026-12-04\n\nReasoning: high\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>\
<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>\
<|start|>user<|message|>Hi<|end|>\
<|start|>assistant<|channel|>final<|message|>Hello!<|end|>\
<|start|>user<|message|>2+2?<|end|>\
<|start|>assistant";
    let segs = render(&msgs, &opts).unwrap();
    assert_eq!(flat(&segs), want);
    // Specials are control segments; user text never is.
    assert!(segs
        .iter()
        .any(|s| matches!(s, Segment::Text(t) if t == "2+2?")));
    assert!(segs
        .iter()
        .filter(|s| matches!(s, Segment::Control(_)))
        .all(|s| matches!(s, Segment::Control(t) if t.starts_with("<|"))));
    // No system message: no developer block.
    let plain = flat(&render(&msgs[1..2], &opts).unwrap());
    assert!(!plain.contains("developer"));
    // A tool result that names no call or function cannot be addressed.
    assert!(render(&[Message::new("tool", "x")], &opts).is_err());
}

#[test]
fn splits_channels_on_ids() {
    // 1..=6 the specials, 10 "analysis", 11 "final", 12 "commentary", 20+ text.
    let ids = HarmonyIds {
        start: 1,
        message: 2,
        end: 3,
        channel: 4,
        ret: 5,
        call: 6,
    };
    let names = |v: &[u32]| {
        v.iter()
            .map(|i| match i {
                10 => "analysis",
                11 => "final",
                12 => "commentary",
                _ => "?",
            })
            .collect::<Vec<_>>()
            .join("")
    };
    let mut s = HarmonySplitter::new(ids, names);
    let reply = [4, 10, 2, 20, 21, 3, 1, 30, 4, 11, 2, 22, 23, 5, 24];
    let got: Vec<Option<Channel>> = reply.iter().map(|&i| s.push(i)).collect();
    use Channel::*;
    assert_eq!(
        got,
        [
            None,
            None,
            None,
            Some(Analysis),
            Some(Analysis),
            None,
            None,
            None,
            None,
            None,
            None,
            Some(Final),
            Some(Final),
            None,
            None
        ]
    );
    assert!(s.done());
    // An unknown channel's body is neither reasoning nor the answer.
    let mut s = HarmonySplitter::new(ids, names);
    for i in [4, 12, 2] {
        s.push(i);
    }
    assert_eq!(s.push(40), Some(Other));
}
