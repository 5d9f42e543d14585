//! Operations: the API key on `/v1` routes (a bearer token compared in constant time, 401 in
//! OpenAI's error shape), `/health` (200 when loaded; the `loading_router` answers 503 until
//! then), `/metrics` in Prometheus text format, and the per-response counters behind it.
//! Reads the engine's and the scheduler's statistics; must not touch generation.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sha2::{Digest, Sha256};

use super::validate::ApiError;
use super::{error, AppState};

/// Counters the handlers and the middleware update.
#[derive(Default)]
pub struct Metrics {
    /// Responses by (route, status).
    responses: Mutex<BTreeMap<(String, u16), u64>>,
    /// Prompt tokens of finished requests.
    pub(super) tokens_in: AtomicU64,
    /// Completion tokens of finished requests.
    pub(super) tokens_out: AtomicU64,
    /// Prompt tokens served from the prompt cache.
    pub(super) tokens_cached: AtomicU64,
    /// Connections refused at the connection cap.
    pub(super) refused_connections: AtomicU64,
    /// How long requests hold a place, milliseconds (a decaying average).
    pub(super) hold_ms: AtomicU64,
    /// Requests admitted by how long they waited for a place (`WAIT_BUCKETS`, then +Inf).
    waits: [AtomicU64; WAIT_BUCKETS.len() + 1],
    /// Microseconds waited for a place, all admitted requests together.
    wait_us: AtomicU64,
}

/// Upper bounds (seconds) of the admission-wait histogram's buckets.
const WAIT_BUCKETS: [f64; 9] = [0.005, 0.05, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

impl Metrics {
    /// A request got a place after waiting `secs`.
    pub(super) fn admitted(&self, secs: f64) {
        let b = WAIT_BUCKETS
            .iter()
            .position(|&u| secs <= u)
            .unwrap_or(WAIT_BUCKETS.len());
        self.waits[b].fetch_add(1, Ordering::Relaxed);
        self.wait_us
            .fetch_add((secs * 1e6) as u64, Ordering::Relaxed);
    }

    /// The admission-wait histogram in Prometheus text format.
    fn wait_histogram(&self, out: &mut String) {
        let name = "deltafin_admission_wait_seconds";
        let _ = writeln!(out, "# HELP {name} How long requests waited for a batch or queue place.\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, c) in self.waits.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = WAIT_BUCKETS
                .get(i)
                .map_or("+Inf".to_string(), |u| u.to_string());
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.wait_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {total}");
    }
}

/// Whether `got` equals the key, in time independent of where they differ (both are hashed
/// first, so not even the length shows).
fn key_matches(got: &str, key: &str) -> bool {
    let (a, b) = (
        Sha256::digest(got.as_bytes()),
        Sha256::digest(key.as_bytes()),
    );
    a.iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// Refuses a `/v1` request without `Authorization: Bearer <key>` when the server has a key.
pub(super) async fn auth(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &st.cfg.api_key {
        let got = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            // The scheme is case-insensitive (RFC 9110 §11.1).
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map_or("", |(_, token)| token);
        if !key_matches(got.trim(), key) {
            let mut r = error(ApiError {
                status: 401,
                message: "missing or wrong API key: send `Authorization: Bearer <key>`".into(),
                param: None,
                kind: "invalid_request_error",
                retry_secs: None,
            });
            r.headers_mut()
                .insert("www-authenticate", HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    next.run(req).await
}

/// Counts every response by route and status.
pub(super) async fn count(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = match req.uri().path() {
        p
        @ ("/v1/models" | "/v1/chat/completions" | "/v1/completions" | "/health" | "/metrics") => {
            p.to_string()
        }
        _ => "other".to_string(),
    };
    let r = next.run(req).await;
    if let Ok(mut m) = st.metrics.responses.lock() {
        *m.entry((route, r.status().as_u16())).or_default() += 1;
    }
    r
}

/// `/health` once the model is loaded.
pub(super) async fn health(State(st): State<Arc<AppState>>) -> Response {
    let b = st.scheduler.stats();
    Json(serde_json::json!({"status": "ok", "model": st.model_id(),
        "active": b.active, "waiting": b.waiting}))
    .into_response()
}

/// What the server answers while the model is loading: `/health` 503 `{"status":"loading"}`,
/// every other route 503 with `Retry-After`.
pub fn loading_router() -> Router {
    let loading = || async {
        let mut r = error(ApiError {
            status: 503,
            message: "the model is still loading; retry later".into(),
            param: None,
            kind: "server_error",
            retry_secs: None,
        });
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("5"));
        r
    };
    Router::new()
        .route(
            "/health",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(serde_json::json!({"status": "loading"})),
                )
            }),
        )
        .fallback(loading)
}

fn line(out: &mut String, name: &str, help: &str, kind: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// `/metrics`: Prometheus text format.
pub(super) async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let mut out = String::new();
    let name = "deltafin_responses_total";
    let _ = writeln!(
        out,
        "# HELP {name} HTTP responses by route and status code."
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    if let Ok(m) = st.metrics.responses.lock() {
        for ((route, code), n) in m.iter() {
            let _ = writeln!(out, "{name}{{route=\"{route}\",code=\"{code}\"}} {n}");
        }
    }
    let m = &st.metrics;
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    line(
        &mut out,
        "deltafin_prompt_tokens_total",
        "Prompt tokens of finished requests.",
        "counter",
        get(&m.tokens_in),
    );
    line(
        &mut out,
        "deltafin_cached_prompt_tokens_total",
        "Prompt tokens resumed from the prompt cache.",
        "counter",
        get(&m.tokens_cached),
    );
    line(
        &mut out,
        "deltafin_completion_tokens_total",
        "Completion tokens of finished requests.",
        "counter",
        get(&m.tokens_out),
    );
    line(
        &mut out,
        "deltafin_refused_connections_total",
        "Connections refused at the connection cap (--max-connections).",
        "counter",
        get(&m.refused_connections),
    );
    m.wait_histogram(&mut out);
    line(
        &mut out,
        "deltafin_waiting_requests",
        "Requests waiting for a batch or queue place.",
        "gauge",
        st.waiting.load(Ordering::SeqCst) as f64,
    );
    let b = st.scheduler.stats();
    line(
        &mut out,
        "deltafin_active_sequences",
        "Requests in the running batch.",
        "gauge",
        b.active as f64,
    );
    line(
        &mut out,
        "deltafin_queue_depth",
        "Requests waiting for a batch place.",
        "gauge",
        b.waiting as f64,
    );
    line(
        &mut out,
        "deltafin_passes_total",
        "Shared passes of the model.",
        "counter",
        b.passes as f64,
    );
    line(
        &mut out,
        "deltafin_pass_seconds_total",
        "Seconds spent in passes (prefill and decode rows together).",
        "counter",
        b.pass_secs,
    );
    line(
        &mut out,
        "deltafin_prefill_rows_total",
        "Prompt positions fed (prefill progress).",
        "counter",
        b.prefill_rows as f64,
    );
    line(
        &mut out,
        "deltafin_decode_rows_total",
        "Decode rows fed (last tokens and drafts).",
        "counter",
        b.decode_rows as f64,
    );
    line(
        &mut out,
        "deltafin_emitted_tokens_total",
        "Tokens emitted.",
        "counter",
        b.emitted as f64,
    );
    let model = st.engine.model();
    let tokens = (b.emitted as f64).max(1.0);
    let spine = model.dense_bytes_read() as f64;
    line(
        &mut out,
        "deltafin_spine_bytes_read_total",
        "Streamed spine bytes read from storage.",
        "counter",
        spine,
    );
    line(
        &mut out,
        "deltafin_spine_bytes_per_token",
        "Streamed spine bytes read per emitted token.",
        "gauge",
        spine / tokens,
    );
    if let Some(e) = model.expert_stats() {
        let name = "deltafin_expert_bytes_per_token";
        let _ = writeln!(
            out,
            "# HELP {name} Expert bytes read per emitted token, by tier.\n# TYPE {name} gauge"
        );
        for (tier, v) in [
            ("home", e.home_bytes),
            ("disk_cache", e.disk_bytes),
            ("shard", e.shard_bytes),
            ("hub", e.hub_bytes),
        ] {
            let _ = writeln!(out, "{name}{{tier=\"{tier}\"}} {}", v as f64 / tokens);
        }
        let served = (e.ram_experts
            + e.prefetch_hits
            + e.home_experts
            + e.disk_experts
            + e.shard_experts
            + e.hub_experts)
            .max(1) as f64;
        line(
            &mut out,
            "deltafin_expert_ram_hit_ratio",
            "Experts served from the RAM tier / all served.",
            "gauge",
            e.ram_experts as f64 / served,
        );
        line(
            &mut out,
            "deltafin_expert_prefetch_hit_ratio",
            "Prefetched experts used / prefetched.",
            "gauge",
            e.prefetch_hits as f64 / e.prefetch_issued.max(1) as f64,
        );
        line(
            &mut out,
            "deltafin_expert_wait_seconds_total",
            "Seconds the model waited for expert bytes.",
            "counter",
            e.read_wait_s,
        );
    }
    let (rss, peak) = crate::runtime::memory::rss();
    line(
        &mut out,
        "deltafin_rss_bytes",
        "Resident memory now (VmRSS).",
        "gauge",
        rss as f64,
    );
    line(
        &mut out,
        "deltafin_peak_rss_bytes",
        "Peak resident memory (VmHWM).",
        "gauge",
        peak as f64,
    );
    if let Some(p) = model.plan() {
        line(
            &mut out,
            "deltafin_memory_plan_bytes",
            "The memory plan's total charge.",
            "gauge",
            p.total as f64,
        );
        line(
            &mut out,
            "deltafin_memory_limit_bytes",
            "The memory the plan was made for.",
            "gauge",
            p.limit as f64,
        );
    }
    ([("content-type", "text/plain; version=0.0.4")], out).into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn key_comparison() {
        assert!(super::key_matches("sk-1", "sk-1"));
        assert!(!super::key_matches("sk-2", "sk-1"));
        assert!(!super::key_matches("", "sk-1"));
        assert!(!super::key_matches("sk-1 ", "sk-1"));
    }
}
