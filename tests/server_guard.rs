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
    let held: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
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
