//! The server tests' plumbing: a K3-nano server on a loopback port, and a minimal HTTP/1.1
//! client (plain and chunked bodies, SSE data lines).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use deltafin::models::k3::K3Model;
use deltafin::server::{AppState, ServerConfig};
use deltafin::tokenizer::Tokenizer;
use serde_json::json;

use super::common;

pub fn start(cfg: ServerConfig) -> SocketAddr {
    start_with(cfg, None)
}

pub fn start_with(cfg: ServerConfig, context: Option<usize>) -> SocketAddr {
    start_state(cfg, context).0
}

/// A server and its state (for the batch scheduler's counts).
#[allow(dead_code)]
pub fn start_state(
    cfg: ServerConfig,
    context: Option<usize>,
) -> (SocketAddr, std::sync::Arc<AppState>) {
    start_dir(cfg, context, &common::nano())
}

/// A server on the model in `dir`.
#[allow(dead_code)]
pub fn start_dir(
    cfg: ServerConfig,
    context: Option<usize>,
    dir: &std::path::Path,
) -> (SocketAddr, std::sync::Arc<AppState>) {
    let dir = dir.to_path_buf();
    let mut model = K3Model::from_dir(&dir, &candle::Device::Cpu).unwrap();
    if let Some(c) = context {
        model.set_context_limit(c);
    }
    let tok = Tokenizer::from_dir(&dir).unwrap();
    start_engine(
        deltafin::Engine::from_parts(Box::new(model), tok, &dir),
        cfg,
    )
}

/// A server on an opened engine (any model family).
#[allow(dead_code)]
pub fn start_engine(
    engine: deltafin::Engine,
    cfg: ServerConfig,
) -> (SocketAddr, std::sync::Arc<AppState>) {
    let state = AppState::new(engine, cfg);
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap();
    let st = state.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(l).unwrap();
            deltafin::server::serve(l, state).await.unwrap();
        });
    });
    (addr, st)
}

/// A minimal HTTP/1.1 client: returns (status, headers, body).
pub fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, String) {
    http_with(addr, method, path, body, "")
}

/// `http` with extra header lines (each ending in `\r\n`).
#[allow(dead_code)]
pub fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, head.to_string(), body)
}

pub fn dechunk(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some((len, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&after[..n]);
        rest = &after[n + 2..];
    }
    out
}

#[allow(dead_code)]
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(String::from)
        .collect()
}

/// Opens a streaming chat request and returns the socket (the response is read by the caller).
#[allow(dead_code)]
pub fn open_stream(addr: SocketAddr, max_tokens: usize) -> TcpStream {
    let body = json!({"messages": [{"role": "user", "content": "go"}], "stream": true, "max_tokens": max_tokens}).to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    s
}
