//! An OpenAI-compatible server (axum) over an `Engine`: `/v1/models`, `/v1/chat/completions`,
//! `/v1/completions`, streaming or not. Generations run on the engine's batch scheduler
//! (`crate::engine::batch`): up to `max_batch` share each pass, a bounded FIFO queue holds the
//! next ones, and a waiting line behind them admits in arrival order (429 with `Retry-After`
//! only when the line is full or a wait runs out). A place is reserved before the
//! prompt is tokenized, tokenizing runs off the async runtime, and a prompt over the context
//! limit gets 400. A client that goes away cancels its generation at the next prefill chunk or
//! token. Files: `listen` (the accept loop: timeouts, the connection cap, the drain on
//! shutdown), `guard` (Host, Content-Type, CORS, the body timeout), `handlers` (the
//! endpoints), `queue` (admission and the hand-off to the scheduler), `sse` (streamed and
//! collected responses), `stop` (stop sequences on the text), `ops` (API key, `/health`,
//! `/metrics`, the loading router), `tools` (tool calls on the wire), `validate`,
//! `completion_request` and `messages` (request bodies), `prompt` (a request to the rendered
//! prompt, shared with `deltafin render`).
//! This file holds the settings, the shared state and the router.

pub mod completion_request;
mod fields;
mod guard;
mod handlers;
mod listen;
pub mod logprobs;
mod messages;
mod ops;
pub mod prompt;
mod queue;
mod sse;
pub mod stop;
pub mod tools;
pub mod validate;

pub use guard::host_allowed;
pub use listen::serve_until;
pub use ops::loading_router;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::engine::batch::{BatchOptions, Scheduler};
use crate::Engine;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use validate::ApiError;

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model id reported and accepted (None: the engine's, its family's `served_id`).
    pub model_id: Option<String>,
    /// Hard ceiling on new tokens per request.
    pub max_tokens: usize,
    /// Default new tokens for raw completions.
    pub completion_default: usize,
    /// Requests decoding at once in shared passes (0: the memory plan's `max_batch`, else 4).
    pub max_batch: usize,
    /// Requests that may wait beyond the batch.
    pub queue: usize,
    /// Most prompt tokens one shared pass feeds beside the decode rows.
    pub prefill_tokens: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Seconds between SSE comment keep-alives.
    pub keepalive_secs: u64,
    /// Speculative decoding for every request (the output is the same either way).
    pub speculation: crate::runtime::generate::Speculation,
    /// Reasoning effort when a request names none (`serve` passes `K3_REASONING_EFFORT`).
    pub default_effort: Option<String>,
    /// Resume requests from the engine's prompt cache (one in RAM is attached when the engine
    /// has none); off: every request prefills its whole prompt.
    pub prompt_cache: bool,
    /// A bearer token every `/v1` route requires (None: no authentication).
    pub api_key: Option<String>,
    /// A test hook: every reply is this text (special tokens allowed), then the end of
    /// message, instead of the model's choice (the model still runs each step).
    pub scripted_reply: Option<String>,
    /// Today's date (YYYY-MM-DD) for chat formats that render one (harmony); the binary's clock.
    pub date: Option<String>,
    /// Time a client has to send a request's headers; also how long a keep-alive connection
    /// may wait without sending its next request.
    pub header_timeout: std::time::Duration,
    /// Time a client has to send a request's whole body (408 after it).
    pub body_timeout: std::time::Duration,
    /// Connections served at once (beyond: 503 and close).
    pub max_connections: usize,
    /// On shutdown, how long requests in flight may take to finish.
    pub shutdown_grace: std::time::Duration,
    /// Host names a request may name besides IP literals and `localhost` (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Origins that may call the server from a web page (CORS; `*` for any). Empty: none.
    pub cors_origins: Vec<String>,
    /// How long a request may wait, in arrival order, for a batch or queue place (429 after).
    pub admission_wait: std::time::Duration,
    /// Requests that may wait for a place (429 beyond).
    pub wait_line: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_id: None,
            max_tokens: 32768,
            completion_default: 256,
            max_batch: 0,
            queue: 0,
            prefill_tokens: 256,
            body_limit: 16 << 20,
            keepalive_secs: 5,
            speculation: Default::default(),
            default_effort: None,
            prompt_cache: true,
            api_key: None,
            scripted_reply: None,
            date: None,
            header_timeout: std::time::Duration::from_secs(30),
            body_timeout: std::time::Duration::from_secs(60),
            max_connections: 4096,
            shutdown_grace: std::time::Duration::from_secs(30),
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            admission_wait: std::time::Duration::from_secs(60),
            wait_line: 256,
        }
    }
}

/// Shared server state.
pub struct AppState {
    engine: Arc<Engine>,
    cfg: ServerConfig,
    /// The batch scheduler every generation runs on.
    scheduler: Scheduler,
    /// Requests decoding at once.
    max_batch: usize,
    /// Batch and queue places (`queue::Place`); tokio's semaphore serves waiters in order.
    places: Arc<tokio::sync::Semaphore>,
    /// Requests waiting for a place.
    waiting: AtomicUsize,
    next_id: AtomicUsize,
    /// The second the server started (in tool call ids).
    started: u64,
    /// Every token's bytes, for `response_format` json_object masks (built on first use).
    json_tokens: std::sync::OnceLock<std::sync::Arc<Vec<Option<Vec<u8>>>>>,
    /// Counters behind `/metrics`.
    metrics: ops::Metrics,
}

impl AppState {
    /// State over an opened engine. With `cfg.prompt_cache`, an engine without a prompt cache
    /// gets one in RAM (the plan's size, else 1 GiB; the binary attaches its own, with
    /// `--prompt-cache DIR`, before this).
    pub fn new(mut engine: Engine, mut cfg: ServerConfig) -> Arc<Self> {
        cfg.model_id
            .get_or_insert_with(|| engine.model_id().to_string());
        if cfg.prompt_cache && engine.prompt_cache().is_none() {
            let mut opts = crate::engine::prompt_cache::PromptCacheOptions::default();
            if let Some(p) = engine.model().plan().filter(|p| p.prompt_cache > 0) {
                opts.ram_bytes = p.prompt_cache;
            }
            if let Err(e) = engine.enable_prompt_cache(opts) {
                tracing::warn!("no prompt cache: {e}");
            }
        }
        let max_batch = match cfg.max_batch {
            0 => engine.model().plan().map_or(4, |p| p.max_batch),
            n => n,
        }
        .max(1);
        let engine = Arc::new(engine);
        // Admission is the server's (`queue::reserve`); the scheduler's own queue has room
        // for the requests that finished in the last pass but have not left it yet.
        let opts = BatchOptions {
            max_batch,
            queue: cfg.queue + max_batch,
            prefill_tokens: cfg.prefill_tokens,
        };
        tracing::info!(
            "serving up to {max_batch} requests in shared passes, {} more queued",
            cfg.queue
        );
        let places = Arc::new(tokio::sync::Semaphore::new(max_batch + cfg.queue));
        Arc::new(AppState {
            scheduler: Scheduler::new(engine.clone(), opts),
            engine,
            cfg,
            max_batch,
            places,
            waiting: AtomicUsize::new(0),
            next_id: AtomicUsize::new(1),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            metrics: Default::default(),
            json_tokens: Default::default(),
        })
    }

    /// The model id reported and accepted.
    pub fn model_id(&self) -> &str {
        self.cfg.model_id.as_deref().unwrap_or("deltafin")
    }

    /// Requests decoding at once.
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    /// What the batch scheduler has done so far.
    pub fn batch_stats(&self) -> crate::engine::batch::BatchStats {
        self.scheduler.stats()
    }
}

/// The router.
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.body_limit;
    let v1 = Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{id}", get(handlers::model))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ops::auth,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(ops::health))
        .route("/metrics", get(ops::metrics))
        .fallback(|| async {
            error(ApiError {
                status: 404,
                message: "unknown route".into(),
                param: None,
                kind: "not_found_error",
                retry_secs: None,
            })
        })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ops::count,
        ))
        .with_state(state)
}

/// Serves on `listener` until the process stops (`serve_until` drains on a signal).
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>) -> std::io::Result<()> {
    serve_until(listener, state, std::future::pending::<()>).await
}

/// An error response (429 with `Retry-After`).
fn error(e: ApiError) -> Response {
    let mut r = (
        StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
        Json(e.body()),
    )
        .into_response();
    if e.status == 429 {
        let secs = e.retry_secs.unwrap_or(1).to_string();
        if let Ok(v) = HeaderValue::from_str(&secs) {
            r.headers_mut().insert("retry-after", v);
        }
    }
    r
}
