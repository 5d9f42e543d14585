//! `deltafin render`: the prompt ids `serve` would feed, per request line, in the model's chat
//! format (no weights loaded). On gpt-oss: harmony's defaults (medium effort, today's date as
//! given), the developer role, tools and calls in openai-harmony's form (scripts/harmony_check.py
//! compares whole prompts with openai-harmony itself); a refused request is an error line, not a
//! failed run. On K3: XTML, and `medium` refused as K3's renderer refuses it.

#[path = "common/runner.rs"]
mod runner;

use std::io::Write;
use std::process::Stdio;

use deltafin::chat::{encode_marked, ChatFormat, ChatOptions, Harmony, Message};
use deltafin::models::gpt_oss::fixture::{write_gpt_oss, GptOssShape};
use deltafin::tokenizer::Tokenizer;
use serde_json::{json, Value};

fn render(root: Option<&std::path::Path>, lines: &[Value]) -> Vec<Value> {
    let mut cmd = runner::command(env!("CARGO_BIN_EXE_deltafin"));
    cmd.args(["render", "--date", "2026-12-04"]);
    if let Some(r) = root {
        cmd.arg("--model-root").arg(r);
    }
    let mut child = cmd
        .env_remove("K3_REASONING_EFFORT")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let body: String = lines.iter().map(|l| format!("{l}\n")).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn renders_what_serve_feeds_on_gpt_oss() {
    let d = tempfile::tempdir().unwrap();
    write_gpt_oss(d.path(), &GptOssShape::tiny(), 0, 1).unwrap();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}}}]);
    let out = render(
        Some(d.path()),
        &[
            json!({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
            json!({"messages": [{"role": "user", "content": "Weather?"}], "tools": tools, "reasoning_effort": "high"}),
            json!({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"}),
            json!({"messages": []}),
        ],
    );
    assert_eq!(out.len(), 4);
    let text = out[0]["text"].as_str().unwrap();
    assert!(
        text.contains("Current date: 2026-12-04\n\nReasoning: medium\n"),
        "{text}"
    );
    assert!(text.contains("<|start|>developer<|message|># Instructions\n\nBe brief.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"), "{text}");
    // The ids are the library's own rendering of the same conversation.
    let tok = Tokenizer::from_dir(d.path()).unwrap();
    let opts = ChatOptions {
        effort: Some(Harmony.effort(None, None).unwrap()),
        date: Some("2026-12-04".into()),
        ..Default::default()
    };
    let msgs = [
        Message::new("system", "Be brief."),
        Message::new("user", "Hi"),
    ];
    let (segs, marks) = Harmony.render(&msgs, &opts).unwrap();
    let want = encode_marked(&tok, &segs, &marks).0;
    let got: Vec<u32> = serde_json::from_value(out[0]["ids"].clone()).unwrap();
    assert_eq!(got, want);
    // Tools in declared order, reasoning high.
    let text = out[1]["text"].as_str().unwrap();
    assert!(text.contains("Reasoning: high"), "{text}");
    assert!(
        text.contains("type get_weather = (_: {\ncity: string,\nunit?: string,\n}) => any;"),
        "{text}"
    );
    assert!(out[2]["error"].as_str().unwrap().contains("extreme"));
    assert!(out[3]["error"].as_str().unwrap().contains("messages"));
}

#[test]
fn renders_xtml_on_k3_and_refuses_medium() {
    let out = render(
        None,
        &[
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
            json!({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "medium"}),
        ],
    );
    let text = out[0]["text"].as_str().unwrap();
    assert!(text.contains("thinking_effort=max"), "{text}");
    assert!(text.contains("<|open|>message role=\"user\""), "{text}");
    assert!(
        out[1]["error"].as_str().unwrap().contains("medium"),
        "{:?}",
        out[1]
    );
}
