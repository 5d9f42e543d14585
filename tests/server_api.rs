//! The OpenAI API fields real clients send, on K3-nano over loopback HTTP: stop sequences.

#[path = "server_util/client.rs"]
mod client;
mod common;

use client::{http, sse_data, start};
use deltafin::server::ServerConfig;
use serde_json::{json, Value};

fn post(addr: std::net::SocketAddr, path: &str, body: &Value) -> Value {
    let (st, _, b) = http(addr, "POST", path, &body.to_string());
    assert_eq!(st, 200, "{b}");
    serde_json::from_str(&b).unwrap()
}

/// The streamed text of a completion and its finish reason.
fn streamed(addr: std::net::SocketAddr, body: &Value) -> (String, String) {
    let mut b = body.clone();
    b["stream"] = json!(true);
    let (st, _, out) = http(addr, "POST", "/v1/completions", &b.to_string());
    assert_eq!(st, 200, "{out}");
    let (mut text, mut finish) = (String::new(), String::new());
    for d in sse_data(&out) {
        if d == "[DONE]" {
            break;
        }
        let c: Value = serde_json::from_str(&d).unwrap();
        text.push_str(c["choices"][0]["text"].as_str().unwrap_or(""));
        if let Some(f) = c["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

/// A stop sequence cut out of the unstopped answer: the answer ends right before its first
/// occurrence (across token boundaries), without it, with finish_reason "stop", streamed or
/// not; of two, the earlier wins; one that never occurs changes nothing.
#[test]
fn stop_sequences_cut_the_text_where_they_first_occur() {
    let addr = start(ServerConfig::default());
    let base = json!({"prompt": "The capital of France is", "max_tokens": 40});
    let full = post(addr, "/v1/completions", &base);
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    assert!(chars.len() > 20, "{text:?}");
    let mut checked = 0;
    for at in [5, 11, chars.len() / 2] {
        // Three characters from `at`: typically spanning a token boundary.
        let (s, e) = (chars[at].0, chars.get(at + 3).map_or(text.len(), |c| c.0));
        let stop = &text[s..e];
        let want = &text[..text.find(stop).unwrap()];
        let mut req = base.clone();
        req["stop"] = json!(stop);
        let got = post(addr, "/v1/completions", &req);
        assert_eq!(got["choices"][0]["text"], want, "stop {stop:?}");
        assert_eq!(got["choices"][0]["finish_reason"], "stop");
        assert!(got["usage"]["completion_tokens"].as_u64().unwrap() <= 40);
        assert_eq!(streamed(addr, &req), (want.to_string(), "stop".to_string()));
        checked += 1;
    }
    assert_eq!(checked, 3);
    // Of two sequences the earlier occurrence wins, whichever is listed first.
    let (a, b) = (
        &text[chars[15].0..chars[17].0],
        &text[chars[4].0..chars[6].0],
    );
    let first = text.find(a).unwrap().min(text.find(b).unwrap());
    let mut req = base.clone();
    req["stop"] = json!([a, b]);
    let got = post(addr, "/v1/completions", &req);
    assert_eq!(got["choices"][0]["text"], &text[..first]);
    // Never occurring: the whole answer, "length".
    req["stop"] = json!(["\u{1F600}never\u{1F600}"]);
    let got = post(addr, "/v1/completions", &req);
    assert_eq!(got["choices"][0]["text"], text.as_str());
    assert_eq!(got["choices"][0]["finish_reason"], "length");
    assert_eq!(streamed(addr, &req), (text.clone(), "length".to_string()));
}

/// On chat the stop applies to the content (the reasoning is not cut).
#[test]
fn chat_stop_cuts_the_content() {
    let addr = start(ServerConfig::default());
    let base = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 60, "thinking": false});
    let full = post(addr, "/v1/chat/completions", &base);
    let content = full["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let chars: Vec<(usize, char)> = content.char_indices().collect();
    assert!(chars.len() > 12, "{content:?}");
    let stop = &content[chars[8].0..chars[11].0];
    let mut req = base.clone();
    req["stop"] = json!([stop]);
    let got = post(addr, "/v1/chat/completions", &req);
    assert_eq!(
        got["choices"][0]["message"]["content"],
        &content[..content.find(stop).unwrap()]
    );
    assert_eq!(got["choices"][0]["finish_reason"], "stop");
}

#[test]
fn bad_stop_fields_are_400_naming_stop() {
    let addr = start(ServerConfig::default());
    for stop in [
        json!(["a", "b", "c", "d", "e"]),
        json!([""]),
        json!(3),
        json!([1]),
    ] {
        let body = json!({"prompt": "x", "stop": stop});
        let (st, _, b) = http(addr, "POST", "/v1/completions", &body.to_string());
        assert_eq!(st, 400, "{b}");
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["error"]["param"], "stop");
    }
}
