//! The server's batch scheduler (issue 31) over real loopback HTTP on K3-nano: concurrent
//! requests of different lengths (greedy and seeded sampling, streamed and not) share passes
//! and each answer equals the one the same request gets alone; a client that disconnects
//! mid-stream leaves the batch and the others are unaffected.

#[path = "server_util/client.rs"]
#[allow(dead_code)]
mod client;
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use client::{http, sse_data, start_state};
use deltafin::server::ServerConfig;
use serde_json::{json, Value};

/// Request `i`: a user message of a length that depends on `i`, some seeded sampling, some
/// streamed.
fn body(i: usize) -> Value {
    let words = [
        "go",
        "tell me more",
        "the quick brown fox jumps over the lazy dog",
    ];
    let content = words[i % 3].repeat(1 + i * 7);
    let mut b = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 6 + (i * 5) % 17,
        "stream": i % 2 == 1,
    });
    if i % 3 == 1 {
        b["temperature"] = json!(0.8);
        b["seed"] = json!(100 + i);
    }
    b
}

/// The answer's text and finish reason (streamed or not).
fn answer(addr: std::net::SocketAddr, b: &Value) -> (String, String) {
    let (st, _, text) = http(addr, "POST", "/v1/chat/completions", &b.to_string());
    assert_eq!(st, 200, "{text}");
    if b["stream"] == json!(true) {
        let mut content = String::new();
        let mut finish = String::new();
        for d in sse_data(&text) {
            if d == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(&d).unwrap();
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                content.push_str(c);
            }
            if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                finish = f.to_string();
            }
        }
        (content, finish)
    } else {
        let v: Value = serde_json::from_str(&text).unwrap();
        let c = &v["choices"][0];
        (
            c["message"]["content"].as_str().unwrap_or("").to_string(),
            c["finish_reason"].as_str().unwrap_or("").to_string(),
        )
    }
}

#[test]
fn concurrent_requests_share_passes_and_match_alone() {
    let (solo, _) = start_state(
        ServerConfig {
            max_batch: 1,
            queue: 16,
            ..Default::default()
        },
        None,
    );
    let (addr, st) = start_state(
        ServerConfig {
            max_batch: 4,
            queue: 16,
            prefill_tokens: 32,
            ..Default::default()
        },
        None,
    );
    assert_eq!(st.max_batch(), 4);
    let n = 10;
    let alone: Vec<(String, String)> = (0..n).map(|i| answer(solo, &body(i))).collect();
    // A client that leaves mid-stream: it holds a batch place until it is gone.
    let leaver = json!({"messages": [{"role": "user", "content": "go"}], "stream": true, "max_tokens": 100_000}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{leaver}", leaver.len()).unwrap();
    let mut buf = [0u8; 256];
    assert!(s.read(&mut buf).unwrap() > 0, "the stream has started");
    let together: Vec<(String, String)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let b = body(i);
                sc.spawn(move || answer(addr, &b))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        drop(s);
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, b)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(a, b, "request {i}: batched answer differs from alone");
    }
    let stats = st.batch_stats();
    eprintln!("batch: {stats:?}");
    assert!(
        stats.seq_passes as f64 >= 1.5 * stats.passes as f64,
        "requests shared passes: {stats:?}"
    );
    // The leaver left: nothing stays in the batch.
    let t0 = Instant::now();
    while st.batch_stats().active > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the batch never emptied"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
