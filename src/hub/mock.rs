//! A mock Hugging Face hub for tests: an in-process axum server that serves a directory at
//! `/{owner}/{name}/resolve/{rev}/{file}` with HEAD, GET and `Range`, the headers hf-hub reads
//! (`ETag`, `X-Repo-Commit`, `Content-Length`, `Content-Range`, `Accept-Ranges`), and fault
//! injection for the next GET requests. Several commits can be served (`push_commit` makes a new
//! one `main`, as a re-upload does). Like the hub's LFS files, a file's ETag is the SHA-256 of its
//! content, computed once per file; files over 1 GiB (sparse K3-shape fixtures) get a
//! size-based ETag instead, as hashing terabytes of holes would take the test's whole budget.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use crate::{Error, Result};

/// The first commit the mock hub serves (`main` until `push_commit`).
pub const MOCK_COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Files up to this size get a SHA-256 ETag.
const SHA_ETAG_MAX: u64 = 1 << 30;

/// A fault applied to one GET request that carries a body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Send half of the body, then drop the connection.
    DropMidBody,
    /// Declare the full Content-Length but send only half of the body.
    ShortBody,
    /// Wait this long before each 64 KiB of body.
    Slow(Duration),
}

struct MockState {
    /// `(commit, directory)`, oldest first; the last is `main`.
    commits: Mutex<Vec<(String, PathBuf)>>,
    /// SHA-256 ETags by `(path, size, mtime)`.
    etags: Mutex<std::collections::HashMap<(PathBuf, u64, std::time::SystemTime), String>>,
    repo: String,
    faults: Mutex<VecDeque<Fault>>,
    gets: AtomicUsize,
    ranged_gets: AtomicUsize,
    /// Every revision a request named, in order.
    revisions: Mutex<Vec<String>>,
}

/// A running mock hub; stopped when dropped.
pub struct MockHub {
    addr: SocketAddr,
    state: Arc<MockState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn parse_range(h: &HeaderMap, size: u64) -> Option<(u64, u64)> {
    let v = h.get("range")?.to_str().ok()?;
    let spec = v.strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: u64 = a.parse().ok()?;
    let end: u64 = if b.is_empty() {
        size.checked_sub(1)?
    } else {
        b.parse().ok()?
    };
    (start <= end && end < size).then_some((start, end + 1))
}

async fn resolve(
    State(st): State<Arc<MockState>>,
    UrlPath((owner, name, rev, file)): UrlPath<(String, String, String, String)>,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let status = |s: StatusCode| {
        Response::builder()
            .status(s)
            .body(Body::empty())
            .unwrap_or_default()
    };
    if let Ok(mut r) = st.revisions.lock() {
        r.push(rev.clone());
    }
    // Each commit by its hash; `main` is the newest.
    let commit = st.commits.lock().ok().and_then(|c| {
        c.iter()
            .rev()
            .find(|(h, _)| rev == "main" || *h == rev)
            .cloned()
    });
    let Some((commit, root)) = commit else {
        return status(StatusCode::NOT_FOUND);
    };
    if format!("{owner}/{name}") != st.repo || file.split('/').any(|p| p == ".." || p.is_empty()) {
        return status(StatusCode::NOT_FOUND);
    }
    let path = root.join(&file);
    let Ok(meta) = std::fs::metadata(&path) else {
        return status(StatusCode::NOT_FOUND);
    };
    let size = meta.len();
    let etag = etag_of(&st, &path, &meta, &file);
    let mut b = Response::builder()
        .header("etag", format!("\"{etag}\""))
        .header("x-repo-commit", commit)
        .header("accept-ranges", "bytes");
    if method == Method::HEAD {
        return b
            .header("content-length", size)
            .body(Body::empty())
            .unwrap_or_default();
    }
    st.gets.fetch_add(1, Ordering::SeqCst);
    let range = parse_range(&headers, size);
    if headers.contains_key("range") && range.is_none() {
        return status(StatusCode::RANGE_NOT_SATISFIABLE);
    }
    let (start, end) = range.unwrap_or((0, size));
    if range.is_some() {
        st.ranged_gets.fetch_add(1, Ordering::SeqCst);
        b = b
            .status(StatusCode::PARTIAL_CONTENT)
            .header("content-range", format!("bytes {start}-{}/{size}", end - 1));
    }
    let fault = st.faults.lock().ok().and_then(|mut f| f.pop_front());
    if let Some(Fault::Status(code)) = fault {
        return status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    }
    let mut data = vec![0u8; (end - start) as usize];
    let Ok(f) = std::fs::File::open(&path) else {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    };
    if f.read_exact_at(&mut data, start).is_err() {
        return status(StatusCode::INTERNAL_SERVER_ERROR);
    }
    let full = data.len();
    b = b.header("content-length", HeaderValue::from(full as u64));
    let chunks: Vec<bytes::Bytes> = data
        .chunks(64 << 10)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let half = full / 2;
    let stream = async_stream(chunks, fault, half);
    b.body(Body::from_stream(stream)).unwrap_or_default()
}

/// The file's SHA-256 (hex), computed once per `(path, size, mtime)`; a size-based tag for
/// files over `SHA_ETAG_MAX`.
fn etag_of(st: &MockState, path: &Path, meta: &std::fs::Metadata, file: &str) -> String {
    let size = meta.len();
    if size > SHA_ETAG_MAX {
        return format!("{size:x}-{}", file.len());
    }
    let key = (
        path.to_path_buf(),
        size,
        meta.modified().unwrap_or(std::time::UNIX_EPOCH),
    );
    if let Some(e) = st.etags.lock().ok().and_then(|m| m.get(&key).cloned()) {
        return e;
    }
    // Streamed in 8 MiB reads: a 1 GiB file is never held in memory.
    let e = crate::checkpoint::source::sha256_file(path, |_| {})
        .unwrap_or_else(|_| format!("{size:x}-{}", file.len()));
    if let Ok(mut m) = st.etags.lock() {
        m.insert(key, e.clone());
    }
    e
}

fn async_stream(
    chunks: Vec<bytes::Bytes>,
    fault: Option<Fault>,
    half: usize,
) -> impl futures_util::Stream<Item = std::result::Result<bytes::Bytes, std::io::Error>> {
    use futures_util::StreamExt;
    let mut sent = 0usize;
    let mut items: Vec<std::result::Result<bytes::Bytes, std::io::Error>> = Vec::new();
    for c in chunks {
        match fault {
            Some(Fault::DropMidBody) | Some(Fault::ShortBody) if sent + c.len() > half => {
                let keep = half - sent;
                if keep > 0 {
                    items.push(Ok(c.slice(..keep)));
                }
                if fault == Some(Fault::DropMidBody) {
                    items.push(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "mock hub: dropped mid-body",
                    )));
                }
                break;
            }
            _ => {
                sent += c.len();
                items.push(Ok(c));
            }
        }
    }
    let delay = match fault {
        Some(Fault::Slow(d)) => Some(d),
        _ => None,
    };
    futures_util::stream::iter(items).then(move |item| async move {
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        item
    })
}

impl MockHub {
    /// Serves `dir` as repository `repo` (`owner/name`) on a free loopback port.
    pub fn start(dir: &Path, repo: &str) -> Result<MockHub> {
        Self::start_on(dir, repo, "127.0.0.1:0")
    }

    /// Serves `dir` as `repo` on `addr` (e.g. `127.0.0.1:8090`).
    pub fn start_on(dir: &Path, repo: &str, addr: &str) -> Result<MockHub> {
        let state = Arc::new(MockState {
            commits: Mutex::new(vec![(MOCK_COMMIT.to_string(), dir.to_path_buf())]),
            etags: Mutex::new(std::collections::HashMap::new()),
            repo: repo.to_string(),
            faults: Mutex::new(VecDeque::new()),
            gets: AtomicUsize::new(0),
            ranged_gets: AtomicUsize::new(0),
            revisions: Mutex::new(Vec::new()),
        });
        let std_listener = std::net::TcpListener::bind(addr)
            .map_err(|e| Error::Msg(format!("mock hub: bind: {e}")))?;
        std_listener
            .set_nonblocking(true)
            .map_err(|e| Error::Msg(format!("mock hub: {e}")))?;
        let addr = std_listener
            .local_addr()
            .map_err(|e| Error::Msg(format!("mock hub: {e}")))?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new()
            .route("/{owner}/{name}/resolve/{rev}/{*file}", get(resolve))
            .with_state(state.clone());
        let thread = std::thread::Builder::new()
            .name("mock-hub".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                else {
                    return;
                };
                rt.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                        return;
                    };
                    let _ = axum::serve(listener, app)
                        .with_graceful_shutdown(async {
                            let _ = rx.await;
                        })
                        .await;
                });
            })
            .map_err(|e| Error::Msg(format!("mock hub: {e}")))?;
        Ok(MockHub {
            addr,
            state,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The revisions requests have named so far, in order.
    pub fn revisions(&self) -> Vec<String> {
        self.state
            .revisions
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Serves `dir` as a new commit `commit` and makes it `main` (a re-upload); earlier commits
    /// stay reachable by their hash.
    pub fn push_commit(&self, commit: &str, dir: &Path) {
        if let Ok(mut c) = self.state.commits.lock() {
            c.push((commit.to_string(), dir.to_path_buf()));
        }
    }

    /// The endpoint to put in `HF_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues a fault for the next GET request with a body.
    pub fn push_fault(&self, f: Fault) {
        if let Ok(mut q) = self.state.faults.lock() {
            q.push_back(f);
        }
    }

    /// Drops every queued fault.
    pub fn clear_faults(&self) {
        if let Ok(mut q) = self.state.faults.lock() {
            q.clear();
        }
    }

    /// GET requests served so far.
    pub fn gets(&self) -> usize {
        self.state.gets.load(Ordering::SeqCst)
    }

    /// GET requests with a `Range` header served so far.
    pub fn ranged_gets(&self) -> usize {
        self.state.ranged_gets.load(Ordering::SeqCst)
    }
}

impl MockHub {
    /// Blocks until the server thread ends (it runs until the process is stopped).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MockHub {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
