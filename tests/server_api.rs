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

/// Every `/v1` route needs the bearer token (401 in OpenAI's shape without it or with another);
/// `/health` and `/metrics` stay open; `/metrics` counts the responses and tokens.
#[test]
fn api_key_health_and_metrics() {
    let addr = start(ServerConfig {
        api_key: Some("sk-local-1".into()),
        ..Default::default()
    });
    let with = |key: Option<&str>, method: &str, path: &str, body: &str| {
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        client::http_with(addr, method, path, body, &auth)
    };
    let body = json!({"prompt": "Hello", "max_tokens": 3}).to_string();
    for (method, path, b) in [
        ("GET", "/v1/models", ""),
        ("POST", "/v1/completions", body.as_str()),
        (
            "POST",
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
        ),
    ] {
        for key in [None, Some("sk-local-2"), Some("")] {
            let (st, head, out) = with(key, method, path, b);
            assert_eq!(st, 401, "{path} {key:?}: {out}");
            assert!(head
                .to_ascii_lowercase()
                .contains("www-authenticate: bearer"));
            let v: Value = serde_json::from_str(&out).unwrap();
            assert!(v["error"]["message"].as_str().unwrap().contains("API key"));
        }
    }
    assert_eq!(with(Some("sk-local-1"), "GET", "/v1/models", "").0, 200);
    let (st, _, out) = with(Some("sk-local-1"), "POST", "/v1/completions", &body);
    assert_eq!(st, 200, "{out}");
    let (st, _, out) = http(addr, "GET", "/health", "");
    assert_eq!(st, 200);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["status"], "ok");
    let (st, head, m) = http(addr, "GET", "/metrics", "");
    assert_eq!(st, 200);
    assert!(head.contains("text/plain"));
    let metric = |name: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing in\n{m}"))
    };
    assert_eq!(
        metric(r#"deltafin_responses_total{route="/v1/models",code="401"}"#),
        3.0
    );
    assert_eq!(
        metric(r#"deltafin_responses_total{route="/v1/completions",code="200"}"#),
        1.0
    );
    assert_eq!(metric("deltafin_completion_tokens_total"), 3.0);
    assert!(metric("deltafin_prompt_tokens_total") >= 1.0);
    assert_eq!(metric("deltafin_emitted_tokens_total"), 3.0);
    assert_eq!(metric("deltafin_active_sequences"), 0.0);
    assert!(metric("deltafin_peak_rss_bytes") > 0.0);
    for name in [
        "deltafin_queue_depth",
        "deltafin_pass_seconds_total",
        "deltafin_prefill_rows_total",
        "deltafin_spine_bytes_per_token",
        r#"deltafin_expert_bytes_per_token{tier="shard"}"#,
        "deltafin_expert_ram_hit_ratio",
        "deltafin_expert_prefetch_hit_ratio",
    ] {
        metric(name);
    }
}

/// While the model loads, `/health` is 503 `{"status":"loading"}` and every route 503 with
/// Retry-After (what `deltafin serve` binds before loading).
#[test]
fn loading_server_answers_503() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            axum::serve(l, deltafin::server::loading_router())
                .await
                .unwrap();
        });
    });
    let (st, _, out) = http(addr, "GET", "/health", "");
    assert_eq!(st, 503);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["status"],
        "loading"
    );
    let (st, head, _) = http(addr, "POST", "/v1/chat/completions", "{}");
    assert_eq!(st, 503);
    assert!(head.to_ascii_lowercase().contains("retry-after"));
}

/// The logits before each generated token, computed directly with the library (prompt, then
/// one token at a time, as decoding runs).
fn direct_logits(prompt: &[u32], gen: &[u32]) -> Vec<Vec<f32>> {
    let dir = common::nano();
    let model = deltafin::models::k3::K3Model::from_dir(&dir, &candle::Device::Cpu).unwrap();
    let mut st = model.new_state();
    let row = |t: candle::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut rows = vec![row(model.forward(prompt, &mut st).unwrap())];
    for &id in &gen[..gen.len().saturating_sub(1)] {
        rows.push(row(model.forward(&[id], &mut st).unwrap()));
    }
    rows
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    l.iter().map(|&v| v as f64 - lse).collect()
}

fn top(lp: &[f64], n: usize) -> Vec<u32> {
    let mut i: Vec<u32> = (0..lp.len() as u32).collect();
    i.sort_by(|a, b| lp[*b as usize].total_cmp(&lp[*a as usize]).then(a.cmp(b)));
    i.truncate(n);
    i
}

/// Completions' `logprobs: 5` (greedy), streamed and not, against log-softmax of the logits
/// computed directly: each token, its log-probability and the top 5.
#[test]
fn completion_logprobs_match_a_direct_computation() {
    let addr = start(ServerConfig::default());
    let tok = deltafin::tokenizer::Tokenizer::from_dir(&common::nano()).unwrap();
    let prompt = "The capital of France is";
    let req = json!({"prompt": prompt, "max_tokens": 10, "logprobs": 5});
    let got = post(addr, "/v1/completions", &req);
    let lp = &got["choices"][0]["logprobs"];
    let text = |id: u32| String::from_utf8_lossy(&tok.token_bytes(id)).into_owned();
    // Greedy: the direct path picks the argmax at each step.
    let ids = tok.encode_ordinary(prompt);
    let mut gen = Vec::new();
    let model =
        deltafin::models::k3::K3Model::from_dir(&common::nano(), &candle::Device::Cpu).unwrap();
    let mut st = model.new_state();
    let mut l = model.forward(&ids, &mut st).unwrap();
    for _ in 0..10 {
        let row = l.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let id = deltafin::runtime::generate::argmax(&row);
        gen.push(id);
        l = model.forward(&[id], &mut st).unwrap();
    }
    let rows = direct_logits(&ids, &gen);
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 10);
    let mut offset = 0;
    for (i, (&id, row)) in gen.iter().zip(&rows).enumerate() {
        let want = log_softmax(row);
        assert_eq!(lp["tokens"][i], text(id), "token {i}");
        let got_lp = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got_lp - want[id as usize]).abs() < 1e-5,
            "{i}: {got_lp} vs {}",
            want[id as usize]
        );
        assert!(got_lp <= 0.0);
        let alts = lp["top_logprobs"][i].as_object().unwrap();
        for t in top(&want, 5) {
            let v = alts[&text(t)].as_f64().unwrap();
            assert!((v - want[t as usize]).abs() < 1e-5 || alts.len() < 5);
        }
        assert_eq!(lp["text_offset"][i], offset);
        offset += text(id).chars().count();
    }
    // Streamed: the same figures, one token per logprobs chunk.
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let (st, _, out) = http(addr, "POST", "/v1/completions", &sreq.to_string());
    assert_eq!(st, 200);
    let streamed: Vec<Value> = sse_data(&out)
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|c| !c["choices"][0]["logprobs"].is_null())
        .map(|c| c["choices"][0]["logprobs"]["token_logprobs"][0].clone())
        .collect();
    assert_eq!(&streamed, lp["token_logprobs"].as_array().unwrap());
}

/// Chat `logprobs` with `top_logprobs: 3` on a seeded sampled request: the reported values are
/// the log-softmax of the exact logits along the sampled path (temperature does not change
/// them); `bytes` name each token.
#[test]
fn chat_logprobs_ignore_sampling_settings() {
    use deltafin::chat::{encode_marked, render_marked, ChatOptions, Message};
    let addr = start(ServerConfig::default());
    let dir = common::nano();
    let tok = deltafin::tokenizer::Tokenizer::from_dir(&dir).unwrap();
    let req = json!({"messages": [{"role": "user", "content": "Hello"}], "thinking": false,
        "max_tokens": 8, "temperature": 1.3, "seed": 7, "logprobs": true, "top_logprobs": 3});
    let got = post(addr, "/v1/chat/completions", &req);
    let content = got["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(content.len(), 8);
    let vocab = tok.num_ranks() + 256;
    let by_bytes: std::collections::HashMap<Vec<u8>, u32> =
        (0..vocab).map(|i| (tok.token_bytes(i), i)).collect();
    let id_of = |e: &Value| -> u32 {
        let b: Vec<u8> = serde_json::from_value(e["bytes"].clone()).unwrap();
        by_bytes[&b]
    };
    let gen: Vec<u32> = content.iter().map(id_of).collect();
    let opts = ChatOptions {
        thinking: false,
        effort: None,
        ..Default::default()
    };
    let (segs, marks) = render_marked(&[Message::new("user", "Hello")], &opts).unwrap();
    let (prompt, _) = encode_marked(&tok, &segs, &marks);
    let rows = direct_logits(&prompt, &gen);
    for (i, (e, row)) in content.iter().zip(&rows).enumerate() {
        let want = log_softmax(row);
        let got_lp = e["logprob"].as_f64().unwrap();
        assert!((got_lp - want[gen[i] as usize]).abs() < 1e-5, "{i}");
        let alts: Vec<u32> = e["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(id_of)
            .collect();
        assert_eq!(alts, top(&want, 3), "{i}");
    }
    for bad in [
        json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
        json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}),
    ] {
        let (st, _, b) = http(addr, "POST", "/v1/chat/completions", &bad.to_string());
        assert_eq!(st, 400, "{b}");
    }
    let (st, _, _) = http(
        addr,
        "POST",
        "/v1/completions",
        &json!({"prompt": "x", "logprobs": true}).to_string(),
    );
    assert_eq!(st, 400);
}
