//! `deltafin serve`: the OpenAI-compatible server's flags, binding before the model loads
//! (`/health` 503 meanwhile), and the hand-off to `deltafin::server`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use deltafin::progress::{PrefillProgress, ProgressMode};

use super::prompt_cache::{load_engine_cached, PromptCacheArgs};
use super::run::SpecArgs;
use super::store::StoreArgs;

/// Arguments of `serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Model directory (default: the built-in K3-tiny).
    #[arg(long)]
    pub model_root: Option<PathBuf>,
    /// Address to bind (loopback by default; anything else warns unless --api-key is given).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port.
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Model id reported by /v1/models and accepted in requests (default: `deltafin-` and the
    /// checkpoint's `model_type`, e.g. `deltafin-kimi-k3`, `deltafin-qwen3-moe`).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Hard ceiling on new tokens per request (also `K3_SERVER_MAX_TOKENS`).
    #[arg(long, env = "K3_SERVER_MAX_TOKENS", default_value_t = 32768)]
    pub max_tokens: usize,
    /// Requests decoding at once in shared passes (one spine read per pass for all of them);
    /// 0: the memory plan's choice (up to 8 whose states fit a quarter of the budget).
    #[arg(long, default_value_t = 0)]
    pub max_batch: usize,
    /// Requests queued in the scheduler while the batch is full.
    #[arg(long, default_value_t = 16)]
    pub queue: usize,
    /// Requests that may wait, in arrival order, for a batch or queue place (beyond: 429
    /// with a Retry-After from the measured time a request takes).
    #[arg(long, default_value_t = 256)]
    pub wait_line: usize,
    /// Seconds a request may wait for a place before it gets 429.
    #[arg(long, default_value_t = 60)]
    pub admission_wait: u64,
    /// Most prompt tokens one shared pass feeds beside the others' decode rows (a new
    /// request's prefill is interleaved with the running decodes in pieces this long).
    #[arg(long, default_value_t = 256)]
    pub prefill_tokens: usize,
    /// Largest request body in MiB (beyond that: 413).
    #[arg(long, default_value_t = 16)]
    pub body_limit_mb: usize,
    /// Bearer token every /v1 route requires (401 otherwise); /health and /metrics stay open.
    #[arg(long, env = "DELTAFIN_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Seconds a client has to send a request's headers; also how long an idle keep-alive
    /// connection is kept waiting for its next request.
    #[arg(long, default_value_t = 30)]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's whole body (408 after it).
    #[arg(long, default_value_t = 60)]
    pub body_timeout: u64,
    /// Connections served at once (beyond: 503 and close); at most the open-file limit less a
    /// margin for the model's own files.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// On SIGTERM or SIGINT, seconds the requests in flight may take to finish (new
    /// connections are refused meanwhile; a second signal stops at once).
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace: u64,
    /// A host name requests may use besides IP addresses and localhost (repeatable): requests
    /// naming any other `Host` get 403 (the defence against DNS rebinding).
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// An origin web pages may call the server from (repeatable; `*` for any): CORS preflight
    /// answered and the header on replies. None by default.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Testing only: every reply is this file's text (special tokens allowed), whatever the
    /// model computes (scripts/openai_client_check.sh uses it for tool calls).
    #[arg(long, hide = true)]
    pub scripted_reply: Option<PathBuf>,
    /// Speculative decoding.
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Expert store settings.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Prompt cache.
    #[command(flatten)]
    pub cache: PromptCacheArgs,
}

/// Runs `deltafin serve`: binds at once and answers `/health` 503 (every other route 503) while
/// the model loads, then serves.
pub fn serve(a: &ServeArgs) -> anyhow::Result<()> {
    let root = super::default_root(a.model_root.as_deref())?;
    let listener = std::net::TcpListener::bind((a.host.as_str(), a.port))
        .map_err(|e| anyhow::anyhow!("cannot bind {}:{}: {e}", a.host, a.port))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    if a.api_key.is_none() && !addr.ip().is_loopback() {
        eprintln!(
            "warning: serving on {addr}, reachable from other machines, without an API key: pass --api-key (or DELTAFIN_API_KEY)"
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let loading = tokio::net::TcpListener::from_std(listener.try_clone()?)?;
        let early = tokio::spawn(async move {
            axum::serve(loading, deltafin::server::loading_router())
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        let args = a.clone();
        let load = tokio::task::spawn_blocking(move || serve_state(&args, &root));
        let state = tokio::select! {
            s = load => s??,
            _ = tokio::signal::ctrl_c() => { eprintln!("stopping"); return Ok(()) }
        };
        let _ = stop.send(());
        let _ = early.await;
        eprintln!(
            "serving `{}` at http://{addr} (OpenAI-compatible; {})",
            state.model_id(),
            if a.api_key.is_some() {
                "API key required on /v1"
            } else {
                "no authentication"
            }
        );
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let signals = signal_count()?;
        let mut asked = 0;
        deltafin::server::serve_until(listener, state, move || {
            asked += 1;
            let (mut rx, want) = (signals.clone(), asked);
            async move {
                let _ = rx.wait_for(|n| *n >= want).await;
            }
        })
        .await?;
        eprintln!("stopped");
        Ok(())
    })
}

/// Counts SIGTERM (service managers, containers) and SIGINT (Ctrl-C) as they come.
fn signal_count() -> std::io::Result<tokio::sync::watch::Receiver<u32>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    let (tx, rx) = tokio::sync::watch::channel(0u32);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tx.send_modify(|n| *n += 1);
            eprintln!(
                "stopping: no new connections; requests in flight finish (a second signal stops at once)"
            );
        }
    });
    Ok(rx)
}

/// The open-file limit raised to its hard limit (each connection holds a descriptor), and
/// the connection cap kept below it with room for the model's files.
fn connection_cap(wanted: usize) -> usize {
    // SAFETY: getrlimit/setrlimit on a valid struct, this process only.
    let soft = unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return wanted.min(768);
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r.rlim_cur = r.rlim_max;
            }
        }
        r.rlim_cur as usize
    };
    let cap = soft.saturating_sub(256).max(16);
    if wanted > cap {
        eprintln!(
            "--max-connections {wanted} is over what the open-file limit ({soft}) allows: {cap}"
        );
    }
    wanted.min(cap)
}

/// Loads the engine and builds the server's state (on a blocking thread).
fn serve_state(
    a: &ServeArgs,
    root: &std::path::Path,
) -> anyhow::Result<Arc<deltafin::server::AppState>> {
    let batch = (a.max_batch > 0).then_some(a.max_batch);
    let mut engine = load_engine_cached(root, &a.store, &a.cache, batch)?;
    a.spec.attach(&mut engine)?;
    // Prefill progress: a line on stderr every few seconds (the SSE stream keeps its
    // keep-alives meanwhile).
    engine
        .model_mut()
        .observe(Arc::new(PrefillProgress::new(ProgressMode::Lines)));
    let scripted_reply = match &a.scripted_reply {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("reading the scripted reply {}", p.display()))?,
        ),
        None => None,
    };
    let cfg = deltafin::server::ServerConfig {
        scripted_reply,
        model_id: a.model_id.clone(),
        max_tokens: a.max_tokens.max(1),
        queue: a.queue,
        max_batch: a.max_batch,
        prefill_tokens: a.prefill_tokens.max(1),
        body_limit: a.body_limit_mb.max(1) << 20,
        speculation: a.spec.speculation(),
        default_effort: std::env::var("K3_REASONING_EFFORT").ok(),
        prompt_cache: !a.cache.no_prompt_cache,
        api_key: a.api_key.clone(),
        header_timeout: std::time::Duration::from_secs(a.header_timeout.max(1)),
        body_timeout: std::time::Duration::from_secs(a.body_timeout.max(1)),
        max_connections: connection_cap(a.max_connections.max(1)),
        shutdown_grace: std::time::Duration::from_secs(a.shutdown_grace),
        allowed_hosts: a.allowed_hosts.clone(),
        cors_origins: a.cors_origins.clone(),
        wait_line: a.wait_line,
        admission_wait: std::time::Duration::from_secs(a.admission_wait),
        // Harmony (gpt-oss) renders the date: the day the server started.
        date: Some(super::reply::today()),
        ..Default::default()
    };
    if deltafin::installed::read_manifest(root)
        .is_some_and(|m| m.mode == deltafin::installed::Mode::Stream)
    {
        eprintln!("streaming install: experts are fetched as they are used, so early requests can take hours");
    }
    eprintln!("loaded {}", root.display());
    Ok(deltafin::server::AppState::new(engine, cfg))
}
