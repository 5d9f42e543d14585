//! Tool calls and prompt scoring over loopback HTTP on K3-nano: tools in, tool calls out (from
//! a scripted reply, plain and streamed), `tool_choice` kept by forced tokens, tool history,
//! and `echo` with `max_tokens: 0` against a direct computation.

#[path = "server_util/client.rs"]
mod client;
mod common;

use client::{http, sse_data, start};
use deltafin::server::ServerConfig;
use serde_json::{json, Value};

fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (st, _, b) = http(addr, "POST", path, &body.to_string());
    (st, serde_json::from_str(&b).unwrap_or(Value::Null))
}

/// The reply the scripted server gives (scripts/openai_client_check.sh uses it too).
const REPLY: &str = include_str!("../scripts/tool_reply.txt");

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    ])
}

fn scripted(reply: &str) -> std::net::SocketAddr {
    start(ServerConfig {
        scripted_reply: Some(reply.into()),
        ..Default::default()
    })
}

fn want_calls() -> Vec<(String, Value)> {
    vec![
        (
            "get_weather".into(),
            json!({"city": "Paris \"centre\" & 漢字", "days": 3, "opts": {"units": ["C", {"x": null}]}}),
        ),
        ("search".into(), json!({"q": "weather\nnow"})),
    ]
}

fn calls_of(v: &Value) -> Vec<(String, Value)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function");
            assert!(c["id"].as_str().unwrap().starts_with("call_"));
            let args = c["function"]["arguments"].as_str().unwrap();
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str(args).unwrap(),
            )
        })
        .collect()
}

/// The reply's tools section comes back as `message.tool_calls` with finish_reason
/// "tool_calls", text before it as content, reasoning as reasoning_content; streamed, as
/// `delta.tool_calls` chunks (index 0, 1) that assemble to the same calls.
#[test]
fn tool_calls_come_back_plain_and_streamed() {
    let addr = scripted(REPLY);
    let req = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools(), "max_tokens": 400});
    let (st, got) = post(addr, "/v1/chat/completions", &req);
    assert_eq!(st, 200, "{got}");
    let c = &got["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls");
    assert_eq!(c["message"]["content"], "Let me check.");
    assert_eq!(c["message"]["reasoning_content"], "I should look it up.");
    assert_eq!(calls_of(&c["message"]["tool_calls"]), want_calls());
    let mut s = req.clone();
    s["stream"] = json!(true);
    let (st, _, out) = http(addr, "POST", "/v1/chat/completions", &s.to_string());
    assert_eq!(st, 200);
    let (mut content, mut calls, mut finish) = (String::new(), Vec::new(), String::new());
    for d in sse_data(&out).iter().filter(|d| *d != "[DONE]") {
        let v: Value = serde_json::from_str(d).unwrap();
        let delta = &v["choices"][0]["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        if let Some(tc) = delta["tool_calls"].as_array() {
            for t in tc {
                assert_eq!(t["index"], calls.len());
                calls.push(t.clone());
            }
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    assert_eq!(content, "Let me check.");
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls_of(&Value::Array(calls)), want_calls());
}

/// Without tools declared the section is text; a malformed call is content, never a 500;
/// `tool_choice: "none"` ends the message where the response closes (forced tokens).
#[test]
fn malformed_or_undeclared_calls_are_content_and_none_forbids_them() {
    let addr = scripted(REPLY);
    let user = json!([{"role": "user", "content": "hi"}]);
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": user, "max_tokens": 400}),
    );
    assert_eq!(st, 200);
    let c = &got["choices"][0];
    assert_eq!(c["finish_reason"], "stop");
    assert!(c["message"]["tool_calls"].is_null());
    assert!(c["message"]["content"]
        .as_str()
        .unwrap()
        .contains("call tool=\"get_weather\""));
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": user, "tools": tools(), "tool_choice": "none", "max_tokens": 400}),
    );
    assert_eq!(st, 200);
    let c = &got["choices"][0];
    assert_eq!(
        (
            c["finish_reason"].as_str(),
            c["message"]["content"].as_str()
        ),
        (Some("stop"), Some("Let me check."))
    );
    assert!(c["message"]["tool_calls"].is_null());
    let bad = REPLY.replace("tool=\"search\" ", "");
    let addr = scripted(&bad);
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": user, "tools": tools(), "max_tokens": 400}),
    );
    assert_eq!(st, 200, "{got}");
    let c = &got["choices"][0];
    assert_eq!(calls_of(&c["message"]["tool_calls"]), want_calls()[..1]);
    assert!(c["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("Let me check.<|open|>call index=\"2\""));
}

/// Tool history (an assistant's calls, then results by `tool_call_id`) is accepted; bad tool
/// fields are 400s naming the field.
#[test]
fn tool_history_and_bad_fields() {
    let addr = start(ServerConfig::default());
    let history = json!([
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "{\"temp\": 21}"}
    ]);
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": history, "tools": tools(), "max_tokens": 3}),
    );
    assert_eq!(st, 200, "{got}");
    let cases = [
        (json!({"tools": {"a": 1}}), "tools"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools(), "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
        ),
    ];
    for (extra, param) in cases {
        let mut req = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            req[k] = v.clone();
        }
        let (st, got) = post(addr, "/v1/chat/completions", &req);
        assert_eq!(
            (st, got["error"]["param"].as_str()),
            (400, Some(param)),
            "{got}"
        );
    }
    let mut stray = history.clone();
    stray[2]["tool_call_id"] = json!("call_zzz");
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": stray, "max_tokens": 2}),
    );
    assert_eq!(st, 400);
    assert!(got["error"]["message"]
        .as_str()
        .unwrap()
        .contains("call_zzz"));
}

/// `echo: true, max_tokens: 0, logprobs: 3` (the loglikelihood request of evaluation
/// harnesses): the prompt comes back with each token's log-probability, the first `null`,
/// against a log-softmax of logits computed one token at a time with the library.
#[test]
fn echo_scores_the_prompt() {
    let addr = start(ServerConfig::default());
    let dir = common::nano();
    let tok = deltafin::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    // Over two of the scheduler's 256-row scoring pieces, so that pieces join up.
    let prompt: String = (0..30)
        .map(|i| {
            format!("Item {i}: the capital of France is Paris, and the largest planet is Jupiter. ")
        })
        .collect();
    let prompt = prompt.as_str();
    let ids = tok.encode_ordinary(prompt);
    assert!(ids.len() > 2 * 256, "{} tokens", ids.len());
    let req = json!({"prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 3});
    let (st, got) = post(addr, "/v1/completions", &req);
    assert_eq!(st, 200, "{got}");
    let c = &got["choices"][0];
    assert_eq!(c["text"], prompt);
    assert_eq!(got["usage"]["completion_tokens"], 0);
    let lp = &c["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), ids.len());
    assert!(lp["token_logprobs"][0].is_null() && lp["top_logprobs"][0].is_null());
    let model = deltafin::models::k3::K3Model::from_dir(&dir, &candle::Device::Cpu).unwrap();
    let mut s = model.new_state();
    let mut worst = 0f64;
    for p in 1..ids.len() {
        let row = model.forward(&ids[p - 1..p], &mut s).unwrap();
        let row = row.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let lse = m + row.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
        let want = row[ids[p] as usize] as f64 - lse;
        let got = lp["token_logprobs"][p].as_f64().unwrap();
        worst = worst.max((got - want).abs());
        // Alternatives are keyed by text (two byte tokens may share one): the best is the max.
        let alts = lp["top_logprobs"][p].as_object().unwrap();
        assert!(!alts.is_empty() && alts.len() <= 3);
        let best = alts
            .values()
            .filter_map(|v| v.as_f64())
            .fold(f64::MIN, f64::max);
        worst = worst.max((best - (m - lse)).abs());
    }
    assert!(worst < 1e-4, "worst |logprob difference| {worst}");
    // With tokens as well: the prompt, then the completion's, in one list.
    let (st, more) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 4, "echo": true, "logprobs": 1}),
    );
    assert_eq!(st, 200);
    let n = more["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        n,
        ids.len() + more["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    assert!(more["choices"][0]["text"]
        .as_str()
        .unwrap()
        .starts_with(prompt));
    // Refused clearly: echo streamed, max_tokens 0 without echo.
    for bad in [
        json!({"prompt": "x", "echo": true, "stream": true}),
        json!({"prompt": "x", "max_tokens": 0}),
    ] {
        let (st, _) = post(addr, "/v1/completions", &bad);
        assert_eq!(st, 400);
    }
}

/// `response_format: json_object` on K3-tiny (a model that writes English, not JSON): greedy
/// and sampled replies, thinking on and off, each ends by itself as one JSON object; a schema
/// is refused with a 400 naming the field.
#[test]
fn json_object_replies_parse() {
    let root = deltafin::assets::k3_tiny().unwrap();
    let (addr, _) = client::start_dir(ServerConfig::default(), None, &root);
    let mut parsed = 0;
    for (i, (temp, thinking)) in [
        (0.0, false),
        (0.8, false),
        (1.3, false),
        (0.0, true),
        (0.8, true),
    ]
    .into_iter()
    .enumerate()
    {
        let req = json!({"messages": [{"role": "user", "content": "Describe a cat as JSON."}],
            "response_format": {"type": "json_object"}, "temperature": temp, "seed": i,
            "thinking": thinking, "max_tokens": 400});
        let (st, got) = post(addr, "/v1/chat/completions", &req);
        assert_eq!(st, 200, "{got}");
        let c = &got["choices"][0];
        let text = c["message"]["content"].as_str().unwrap();
        if c["finish_reason"] == "stop" {
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(v.is_object(), "{text}");
            parsed += 1;
        } else {
            // Cut by the token limit (K3-tiny writes long English strings): still a valid
            // start of an object, opening with `{`.
            assert_eq!(c["finish_reason"], "length", "{got}");
            let mut s = deltafin::chat::JsonState::default();
            assert!(
                text.starts_with('{') && text.bytes().all(|b| s.feed(b)),
                "{text:?}"
            );
        }
    }
    eprintln!("{parsed} of 5 replies closed their object within 400 tokens");
    let (st, got) = post(
        addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}),
    );
    assert_eq!(
        (st, got["error"]["param"].as_str()),
        (400, Some("response_format"))
    );
}

/// `json_schema` on K3-tiny: replies that end are valid against the schema (checked by hand
/// here; scripts/schema_check.py checks sampled replies with the `jsonschema` package), replies
/// cut by the limit are a prefix the walk accepts; a schema outside the subset is a 400 that
/// names the keyword.
#[test]
fn json_schema_replies_follow_the_schema() {
    let root = deltafin::assets::k3_tiny().unwrap();
    let (addr, _) = client::start_dir(ServerConfig::default(), None, &root);
    let schema = json!({"type": "object", "properties": {
        "mood": {"enum": ["calm", "angry", "sleepy"]},
        "legs": {"type": "integer"},
        "indoor": {"type": "boolean"},
        "toys": {"type": "array", "items": {"enum": ["ball", "mouse"]}, "maxItems": 2}},
        "required": ["mood", "legs", "indoor"], "additionalProperties": false});
    let compiled = deltafin::chat::Schema::compile(&schema).unwrap();
    let mut ended = 0;
    for (i, (temp, thinking)) in [(0.0, false), (0.9, false), (0.0, true), (1.2, false)]
        .into_iter()
        .enumerate()
    {
        let req = json!({"messages": [{"role": "user", "content": "Describe a cat."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "cat", "strict": true, "schema": schema}},
            "temperature": temp, "seed": i, "thinking": thinking, "max_tokens": 300});
        let (st, got) = post(addr, "/v1/chat/completions", &req);
        assert_eq!(st, 200, "{got}");
        let c = &got["choices"][0];
        let text = c["message"]["content"].as_str().unwrap();
        let mut walk = deltafin::chat::SchemaMachine::new(&compiled);
        assert!(text.bytes().all(|b| walk.feed(&compiled, b)), "{text:?}");
        if c["finish_reason"] == "stop" {
            assert!(walk.done(), "{text:?}");
            let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            let o = v.as_object().unwrap();
            assert!(["calm", "angry", "sleepy"].contains(&o["mood"].as_str().unwrap()));
            assert!(o["legs"].is_i64() || o["legs"].is_u64(), "{text}");
            assert!(o["indoor"].is_boolean(), "{text}");
            assert!(o
                .keys()
                .all(|k| ["mood", "legs", "indoor", "toys"].contains(&k.as_str())));
            assert!(o
                .get("toys")
                .is_none_or(|t| t.as_array().unwrap().len() <= 2));
            ended += 1;
        } else {
            assert_eq!(c["finish_reason"], "length", "{got}");
        }
    }
    eprintln!("{ended} of 4 schema replies ended within 300 tokens");
    for (schema, want) in [
        (
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}),
            "pattern",
        ),
        (json!({"type": "array"}), "root must be an object"),
    ] {
        let req = json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}});
        let (st, got) = post(addr, "/v1/chat/completions", &req);
        assert_eq!(
            (st, got["error"]["param"].as_str()),
            (400, Some("response_format")),
            "{got}"
        );
        assert!(
            got["error"]["message"].as_str().unwrap().contains(want),
            "{got}"
        );
    }
    let req = json!({"messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}});
    assert_eq!(
        post(addr, "/v1/chat/completions", &req).0,
        400,
        "a missing name"
    );
}

/// A demanded call comes even when the reply never closes its think block: the end of message
/// it picks there closes the think block and the response, the call opens (named, or `<|open|>call`
/// for `required`) and the reply writes its arguments.
#[test]
fn demanded_calls_come_when_thinking_never_ends() {
    let args = "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>";
    let user = json!([{"role": "user", "content": "weather?"}]);
    for (choice, rest) in [
        (
            json!({"type": "function", "function": {"name": "get_weather"}}),
            String::new(),
        ),
        (
            json!("required"),
            " tool=\"get_weather\" index=\"1\"<|sep|>".to_string(),
        ),
    ] {
        let addr = scripted(&format!("Hmm, the weather.<|end_of_msg|>{rest}{args}"));
        let body = json!({"messages": user, "tools": tools(), "tool_choice": choice,
            "thinking": true, "max_tokens": 400});
        let (st, got) = post(addr, "/v1/chat/completions", &body);
        assert_eq!(st, 200, "{got}");
        let c = &got["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{choice}: {got}");
        assert_eq!(c["message"]["reasoning_content"], "Hmm, the weather.");
        let want = vec![("get_weather".to_string(), json!({"city": "Paris"}))];
        assert_eq!(calls_of(&c["message"]["tool_calls"]), want, "{choice}");
    }
}
