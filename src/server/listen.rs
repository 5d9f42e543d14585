//! The server's accept loop over hyper (axum's `serve` has no header timeout, no connection
//! cap and no drain): each connection is served by hyper's HTTP/1.1 connection with a header
//! read timeout (which also closes a keep-alive connection that sends no next request in that
//! time), at most `max_connections` at once (beyond that a short 503 and close, so the process
//! never runs out of file descriptors), accept errors (a full descriptor table) waited out
//! rather than spun on. On the first shutdown signal it stops accepting, lets every
//! connection finish the request it is serving (a stream runs to its `[DONE]`) for up to the
//! grace period, then returns; a second signal returns at once. Owns the sockets; the routes
//! are `router`'s.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{router, AppState};

/// Connections being served; dropped with its connection.
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The reply to a connection over the cap.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 108\r\n\r\n\
{\"error\":{\"message\":\"too many open connections\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}";

/// Gives the heap back to the system after a connection storm ends (with fastbins off:
/// `deltafin::init`): glibc keeps what
/// thousands of connections' buffers freed (RSS 22 MB before 2,000 idle connections, 42 MB
/// after they closed, 51 MB after a second storm), so when 256 or more fewer
/// connections are open than at the peak since the last trim (counted at each accept, looked
/// at twice a second), the allocator is trimmed.
async fn trim_after_storms(open: Arc<AtomicUsize>, peak: Arc<AtomicUsize>) {
    // Ticks until a second trim, for what the closing connections' tasks free late.
    let mut again = 0u32;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = open.load(Ordering::SeqCst);
        if peak.load(Ordering::SeqCst) >= now + 256 {
            peak.store(now, Ordering::SeqCst);
            trim();
            again = 4;
        } else if again > 0 {
            again -= 1;
            if again == 0 {
                trim();
            }
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only returns free heap pages to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

/// Serves `listener` until `signal()` resolves, then drains (see the module header); a second
/// `signal()` during the drain ends it at once.
pub async fn serve_until<F, S>(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    mut signal: S,
) -> std::io::Result<()>
where
    S: FnMut() -> F,
    F: Future<Output = ()>,
{
    let (header, max, grace) = (
        state.cfg.header_timeout,
        state.cfg.max_connections.max(1),
        state.cfg.shutdown_grace,
    );
    let app = router(state.clone());
    let open = Arc::new(AtomicUsize::new(0));
    let (drain, drained) = tokio::sync::watch::channel(false);
    // The most connections open at once since the last trim.
    let peak = Arc::new(AtomicUsize::new(0));
    let trimmer = tokio::spawn(trim_after_storms(open.clone(), peak.clone()));
    let stop = signal();
    tokio::pin!(stop);
    let mut last_warning: Option<Instant> = None;
    loop {
        let sock = tokio::select! {
            r = listener.accept() => r,
            _ = &mut stop => break,
        };
        let sock = match sock {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: the table frees as connections close.
                if last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(5)) {
                    tracing::warn!("accept: {e}");
                    last_warning = Some(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if open.load(Ordering::SeqCst) >= max {
            state
                .metrics
                .refused_connections
                .fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut sock = sock;
                let _ = tokio::time::timeout(Duration::from_secs(2), sock.write_all(BUSY)).await;
                let _ = sock.shutdown().await;
                // A lingering close: read what the client is still sending (its request) for
                // a moment, so closing does not reset the connection before it reads the 503.
                let mut sink = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    while matches!(sock.read(&mut sink).await, Ok(n) if n > 0) {}
                })
                .await;
            });
            continue;
        }
        let n = open.fetch_add(1, Ordering::SeqCst) + 1;
        peak.fetch_max(n, Ordering::SeqCst);
        let held = Open(open.clone());
        let app = app.clone();
        let mut drained = drained.clone();
        tokio::spawn(async move {
            let _held = held;
            let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let mut app = app.clone();
                tower_service::Service::call(&mut app, req.map(axum::body::Body::new))
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new()).header_read_timeout(header);
            let conn = b.serve_connection(TokioIo::new(sock), svc);
            tokio::pin!(conn);
            let draining = async move {
                let _ = drained.wait_for(|d| *d).await;
            };
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = draining => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    trimmer.abort();
    let t = Instant::now();
    let _ = drain.send(true);
    tracing::info!(
        "stopping: {} connection(s) finishing (up to {} s)",
        open.load(Ordering::SeqCst),
        grace.as_secs()
    );
    let second = signal();
    tokio::pin!(second);
    while open.load(Ordering::SeqCst) > 0 && t.elapsed() < grace {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = &mut second => {
                tracing::warn!("second signal: stopping now");
                break;
            }
        }
    }
    // The prompt cache writes each entry whole when it saves it: nothing to flush.
    Ok(())
}
