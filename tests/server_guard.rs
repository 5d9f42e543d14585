//! The server left running, black-box over loopback: a slow header and a slow or cut body are
//! closed in time, a connection storm over the cap gets 503 and leaves the server serving,
//! cross-site requests (text/plain, form bodies, foreign Host) are refused, CORS is answered
//! only when allowed, `GET /v1/models/{id}`, the Bearer scheme in any case, and a non-string
//! model is a 400. SIGTERM with a stream in flight is `tests/server_shutdown.rs`'s.

#[path = "server_util/client.rs"]
mod client;
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use client::{http, http_with, start};
use deltafin::server::ServerConfig;

fn raw(addr: std::net::SocketAddr, req: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn status(reply: &str) -> u16 {
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[test]
fn slow_and_cut_requests_are_closed_in_time() {
    let addr = start(ServerConfig {
        header_timeout: Duration::from_secs(2),
        body_timeout: Duration::from_secs(2),
        ..Default::default()
    });
    // Slowloris: headers a byte at a time, never finished.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t = Instant::now();
    let mut closed = false;
    for b in b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
        if s.write_all(&[*b]).is_err() {
            closed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    if !closed {
        let mut buf = [0u8; 256];
        closed = matches!(s.read(&mut buf), Ok(0) | Err(_));
    }
    assert!(closed, "a header sent slowly was not cut");
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    // A chunked body cut off with the connection kept open: 408, then closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let t = Instant::now();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"mes\r\n").unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let reply = String::from_utf8_lossy(&out);
    assert_eq!(status(&reply), 408, "{reply}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    // The server still answers.
    assert_eq!(http(addr, "GET", "/v1/models", "").0, 200);
}

#[test]
fn a_connection_storm_over_the_cap_gets_503_and_the_server_keeps_serving() {
    let addr = start(ServerConfig {
        max_connections: 200,
        ..Default::default()
    });
    // 2,000 idle connections: the first 200 are held, the rest refused with 503 and closed.
    let mut held: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // A burst can overflow the listen backlog (its SYNs are retried a second later): wait
    // until the server holds 200, i.e. a probe is refused.
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        if String::from_utf8_lossy(&out).contains(" 503 ") {
            break;
        }
        held.push(s);
        assert!(held.len() < 260, "the cap never took effect");
    }
    let mut busy = 0;
    for _ in 0..1800 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        busy += usize::from(String::from_utf8_lossy(&out).contains(" 503 "));
    }
    assert_eq!(busy, 1800);
    let (st, _, b) = http(addr, "GET", "/metrics", "");
    assert_eq!(st, 503, "at the cap a new connection is refused: {b}");
    drop(held);
    // Once they close, a normal request is served.
    let t = Instant::now();
    loop {
        let (st, _, b) = http(addr, "GET", "/metrics", "");
        if st == 200 {
            assert!(b.contains("deltafin_refused_connections_total"), "{b}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "still {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn cross_site_requests_are_refused() {
    let addr = start(ServerConfig {
        max_tokens: 2,
        allowed_hosts: vec!["my-box.lan".into()],
        ..Default::default()
    });
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let reply = raw(addr, &format!("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ct}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
        assert_eq!(status(&reply), 415, "{ct}: {reply}");
    }
    let reply = raw(addr, &format!("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()));
    assert_eq!(status(&reply), 415, "no Content-Type: {reply}");
    // DNS rebinding: a page's own name pointed at 127.0.0.1.
    for host in [
        "evil.example",
        "evil.example:8000",
        "127.0.0.1.evil.example",
    ] {
        let reply = raw(
            addr,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status(&reply), 403, "{host}: {reply}");
    }
    for host in [
        "127.0.0.1:8000",
        "[::1]:8000",
        "localhost",
        "LOCALHOST:1",
        "my-box.lan:8000",
        "192.168.1.9",
    ] {
        let reply = raw(
            addr,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status(&reply), 200, "{host}: {reply}");
    }
    // No CORS unless asked: a preflight is refused and no reply carries the header.
    let reply = raw(addr, "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: POST\r\nConnection: close\r\n\r\n");
    assert_eq!(status(&reply), 405, "{reply}");
    assert!(!reply
        .to_ascii_lowercase()
        .contains("access-control-allow-origin"));
    // `application/json; charset=utf-8` is JSON.
    let (st, _, b) = http_with(addr, "POST", "/v1/chat/completions", body, "");
    assert_eq!(st, 200, "{b}");
}

#[test]
fn cors_only_for_the_named_origin() {
    let addr = start(ServerConfig {
        cors_origins: vec!["https://app.example".into()],
        ..Default::default()
    });
    let pre = |origin: &str| {
        raw(addr, &format!("OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"))
    };
    let ok = pre("https://app.example").to_ascii_lowercase();
    assert_eq!(status(&ok), 204, "{ok}");
    assert!(
        ok.contains("access-control-allow-origin: https://app.example"),
        "{ok}"
    );
    assert!(
        ok.contains("access-control-allow-headers: authorization, content-type"),
        "{ok}"
    );
    assert_eq!(status(&pre("https://evil.example")), 405);
    let reply = raw(addr, "GET /v1/models HTTP/1.1\r\nHost: localhost\r\nOrigin: https://app.example\r\nConnection: close\r\n\r\n").to_ascii_lowercase();
    assert!(
        reply.contains("access-control-allow-origin: https://app.example"),
        "{reply}"
    );
}

#[test]
fn models_retrieve_bearer_case_and_a_numeric_model() {
    let addr = start(ServerConfig {
        api_key: Some("sekrit".into()),
        max_tokens: 2,
        ..Default::default()
    });
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (st, _, b) = http_with(
            addr,
            "GET",
            "/v1/models/deltafin-kimi-k3",
            "",
            &format!("Authorization: {scheme} sekrit\r\n"),
        );
        assert_eq!(st, 200, "{scheme}: {b}");
        assert!(b.contains("\"id\":\"deltafin-kimi-k3\""), "{b}");
    }
    let auth = "Authorization: Bearer sekrit\r\n";
    let (st, _, b) = http_with(addr, "GET", "/v1/models/gpt-4", "", auth);
    assert_eq!(st, 404, "{b}");
    assert_eq!(
        http_with(
            addr,
            "GET",
            "/v1/models/deltafin-kimi-k3",
            "",
            "Authorization: Basic sekrit\r\n"
        )
        .0,
        401
    );
    let body = r#"{"model":42,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
    let (st, _, b) = http_with(addr, "POST", "/v1/chat/completions", body, auth);
    assert_eq!(st, 400, "{b}");
    assert!(b.contains("\"param\":\"model\""), "{b}");
}

/// 32 clients that retry on 429 as the official client does (after `Retry-After`), 3 requests
/// each, against 2 batch and 2 queue places: every request is answered, in arrival order (a
/// request waits in line instead of losing its turn to a later one), and the slowest wait is
/// bounded by the line ahead of it, not by luck. A full line gets 429 with a Retry-After.
#[test]
fn retrying_clients_are_served_in_arrival_order() {
    let (addr, _) = client::start_state(
        ServerConfig {
            max_batch: 2,
            queue: 2,
            max_tokens: 6,
            ..Default::default()
        },
        None,
    );
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":6}"#;
    let t0 = Instant::now();
    let waits: Vec<(f64, usize)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..32)
            .map(|_| {
                sc.spawn(|| {
                    (0..3)
                        .map(|_| {
                            let t = Instant::now();
                            let mut tries = 0;
                            loop {
                                tries += 1;
                                let (st, head, b) =
                                    http(addr, "POST", "/v1/chat/completions", body);
                                if st == 200 {
                                    return (t.elapsed().as_secs_f64(), tries);
                                }
                                assert_eq!(st, 429, "{b}");
                                let secs: u64 = head
                                    .lines()
                                    .find_map(|l| {
                                        l.to_ascii_lowercase()
                                            .strip_prefix("retry-after: ")
                                            .map(|v| v.trim().parse().unwrap_or(1))
                                    })
                                    .unwrap_or(1);
                                std::thread::sleep(Duration::from_secs(secs));
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let total = t0.elapsed().as_secs_f64();
    let mut w: Vec<f64> = waits.iter().map(|x| x.0).collect();
    w.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99, max) = (w[w.len() / 2], w[w.len() * 99 / 100], w[w.len() - 1]);
    let retried = waits.iter().filter(|x| x.1 > 1).count();
    eprintln!(
        "32 clients x 3 requests: p50 {p50:.3} s, p99 {p99:.3} s, max {max:.3} s, {retried} retried, all done in {total:.1} s"
    );
    assert_eq!(retried, 0, "a request got 429 although the line had room");
    // In arrival order, no request waits longer than the whole line ahead of it (the 32
    // requests in flight at once) takes: at most a third of the run, with a margin.
    assert!(
        max <= total / 3.0 + 2.0,
        "max wait {max:.2} s of a {total:.1} s run"
    );
    let (_, _, m) = http(addr, "GET", "/metrics", "");
    assert!(
        m.contains("deltafin_admission_wait_seconds_count 96"),
        "{m}"
    );
}

#[test]
fn a_full_waiting_line_gets_429_with_retry_after() {
    let addr = start(ServerConfig {
        max_batch: 1,
        queue: 0,
        wait_line: 1,
        admission_wait: Duration::from_secs(1),
        max_tokens: 1_000_000,
        ..Default::default()
    });
    let long =
        r#"{"messages":[{"role":"user","content":"go"}],"stream":true,"max_tokens":1000000}"#;
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{long}", long.len()).unwrap();
    let mut buf = [0u8; 256];
    assert!(s.read(&mut buf).unwrap() > 0);
    let quick = r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":2}"#;
    // One waits its second out, then 429; meanwhile a second finds the line full at once.
    let t = Instant::now();
    let (a, b) = std::thread::scope(|sc| {
        let h = sc.spawn(|| http(addr, "POST", "/v1/chat/completions", quick));
        std::thread::sleep(Duration::from_millis(300));
        let b = http(addr, "POST", "/v1/chat/completions", quick);
        (h.join().unwrap(), b)
    });
    assert_eq!(b.0, 429, "{}", b.2);
    assert!(b.2.contains("waiting place"), "{}", b.2);
    assert_eq!(a.0, 429, "{}", a.2);
    assert!(a.2.contains("within 1 s"), "{}", a.2);
    assert!(t.elapsed() >= Duration::from_millis(900));
    assert!(
        a.1.to_ascii_lowercase().contains("retry-after: "),
        "{}",
        a.1
    );
}

/// Inputs that deserve a 400 naming the field, not a silent repair.
#[test]
fn bad_inputs_get_400_naming_the_field() {
    let addr = start(ServerConfig {
        max_tokens: 4,
        ..Default::default()
    });
    let user = r#"{"role":"user","content":"hi"}"#;
    let cases = [
        (
            r#"{"messages":[{"role":"user","content":null}]}"#.to_string(),
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user"}]}"#.to_string(),
            "messages[0].content",
        ),
        (
            format!(r#"{{"messages":[{user}],"max_tokens":1000000000000}}"#),
            "max_tokens",
        ),
        (
            format!(r#"{{"messages":[{user}],"max_tokens":1e30}}"#),
            "max_tokens",
        ),
        (
            format!(r#"{{"messages":[{user}],"max_completion_tokens":-1}}"#),
            "max_completion_tokens",
        ),
        (
            format!(r#"{{"messages":[{user}],"max_completion_tokens":1000000000000}}"#),
            "max_completion_tokens",
        ),
        (
            format!(r#"{{"messages":[{user}],"max_tokens":3,"max_completion_tokens":2.5}}"#),
            "max_completion_tokens",
        ),
        (
            format!(
                r#"{{"messages":[{user}],"stop":"{}"}}"#,
                "x".repeat(1 << 20)
            ),
            "stop",
        ),
        (format!(r#"{{"model":42,"messages":[{user}]}}"#), "model"),
    ];
    for (body, param) in &cases {
        let (st, _, b) = http(addr, "POST", "/v1/chat/completions", body);
        assert_eq!(st, 400, "{}: {b}", &body[..body.len().min(120)]);
        assert!(
            b.contains(&format!("\"param\":\"{param}\"")),
            "{param}: {b}"
        );
    }
    // What is fine stays fine: an assistant turn with content "" and both limits within the context.
    let ok = format!(
        r#"{{"messages":[{user},{{"role":"assistant","content":""}},{user}],"max_tokens":3,"max_completion_tokens":2}}"#
    );
    let (st, _, b) = http(addr, "POST", "/v1/chat/completions", &ok);
    assert_eq!(st, 200, "{b}");
    assert!(b.contains("\"completion_tokens\":2"), "{b}");
}

/// Completions prompts as token ids (lm-eval and benchmark clients send them): one list, or a
/// list holding one, gives what the same prompt as text gives; an id past the vocabulary and
/// several prompts are 400s naming `prompt`.
#[test]
fn token_array_prompts() {
    let addr = start(ServerConfig {
        max_tokens: 6,
        ..Default::default()
    });
    let text = r#"{"prompt":"The quick brown fox","max_tokens":5,"echo":true,"logprobs":0}"#;
    let (st, _, b) = http(addr, "POST", "/v1/completions", text);
    assert_eq!(st, 200, "{b}");
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    let e = common::nano();
    let tok = deltafin::tokenizer::Tokenizer::from_dir(&e).unwrap();
    let ids = tok.encode_ordinary("The quick brown fox");
    let want_text = v["choices"][0]["text"].as_str().unwrap().to_string();
    for body in [
        format!(r#"{{"prompt":{ids:?},"max_tokens":5,"echo":true,"logprobs":0}}"#),
        format!(r#"{{"prompt":[{ids:?}],"max_tokens":5,"echo":true,"logprobs":0}}"#),
    ] {
        let (st, _, b) = http(addr, "POST", "/v1/completions", &body);
        assert_eq!(st, 200, "{b}");
        let w: serde_json::Value = serde_json::from_str(&b).unwrap();
        assert_eq!(w["choices"][0]["text"], want_text.as_str(), "{body}");
        assert_eq!(
            w["choices"][0]["logprobs"]["token_logprobs"],
            v["choices"][0]["logprobs"]["token_logprobs"],
            "{body}"
        );
        assert_eq!(w["usage"]["prompt_tokens"], ids.len());
    }
    for (body, says) in [
        (r#"{"prompt":[1,2,99999999],"max_tokens":2}"#, "99999999"),
        (r#"{"prompt":[[1,2],[3,4]],"max_tokens":2}"#, "2 prompts"),
        (r#"{"prompt":["a","b"],"max_tokens":2}"#, "2 prompts"),
        (r#"{"prompt":[1,-2],"max_tokens":2}"#, "non-negative"),
        (r#"{"prompt":[],"max_tokens":2}"#, "empty"),
    ] {
        let (st, _, b) = http(addr, "POST", "/v1/completions", body);
        assert_eq!(st, 400, "{body}: {b}");
        assert!(
            b.contains("\"param\":\"prompt\"") && b.contains(says),
            "{body}: {b}"
        );
    }
}
