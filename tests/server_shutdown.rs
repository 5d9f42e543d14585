//! `deltafin serve` stopped by SIGTERM (how service managers and containers stop it) with a
//! stream in flight: the stream runs to its `[DONE]`, new connections are refused meanwhile,
//! and the process exits 0.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn sigterm_lets_the_stream_in_flight_finish_and_exits_0() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltafin"))
        .args([
            "serve",
            "--port",
            &port.to_string(),
            "--shutdown-grace",
            "60",
            "--model-root",
        ])
        .arg(common::nano())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let mut s = loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut line = String::new();
            let _ = BufReader::new(&s).read_line(&mut line);
            if line.contains(" 200 ") {
                break TcpStream::connect(("127.0.0.1", port)).unwrap();
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let body = r#"{"messages":[{"role":"user","content":"go"}],"stream":true,"max_tokens":1500}"#;
    write!(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    while !line.starts_with("data: {") {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "no data came");
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stop = Instant::now();
    let mut rest = String::new();
    let mut datas = 0;
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        datas += usize::from(line.starts_with("data: {"));
        rest.push_str(&line);
    }
    assert!(
        rest.contains("data: [DONE]"),
        "the stream was cut: {}",
        &rest[rest.len().saturating_sub(300)..]
    );
    assert!(rest.contains("\"finish_reason\""), "no final chunk");
    assert!(
        datas > 5,
        "only {datas} chunks after the signal: the stream had ended already"
    );
    let code = child.wait().unwrap();
    assert!(code.success(), "exit status {code:?}");
    eprintln!(
        "stream finished and server exited {:?} after SIGTERM",
        stop.elapsed()
    );
    // Nothing listens any more.
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}
