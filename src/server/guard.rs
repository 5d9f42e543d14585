//! What every request passes before a route sees it: the `Host` allow-list (an IP literal,
//! `localhost` and its subdomains, or a name the operator allowed: a web page that rebinds its
//! own domain name to 127.0.0.1 gets 403, so it cannot read replies), `application/json` for
//! every POST (415 otherwise: a cross-site form or `text/plain` POST needs no CORS preflight,
//! so the server refuses what a browser can send without asking), CORS only for the origins
//! the operator named (preflight answered, the header on replies), and the body read whole
//! within the body timeout (408 otherwise: a client that sends a byte a second, or cuts a
//! chunked body and keeps the connection open, does not hold a place forever). Owns these
//! checks; the routes and the accept loop are elsewhere.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::validate::ApiError;
use super::{error, AppState};

/// Whether `host` (a `Host` header value, port included or not) may reach the server.
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = match host.strip_prefix('[') {
        // `[v6]:port`
        Some(rest) => {
            return rest
                .split(']')
                .next()
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        }
        None => host.rsplit_once(':').map_or(host, |(h, p)| {
            if p.bytes().all(|b| b.is_ascii_digit()) {
                h
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
}

fn refuse(status: u16, message: String) -> Response {
    error(ApiError {
        status,
        message,
        param: None,
        kind: "invalid_request_error",
        retry_secs: None,
    })
}

/// The CORS headers for `origin` when the operator allowed it.
fn cors(st: &AppState, headers: &HeaderMap) -> Option<HeaderValue> {
    let origin = headers.get("origin")?;
    let o = origin.to_str().ok()?;
    st.cfg
        .cors_origins
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(o))
        .then(|| origin.clone())
}

/// The checks of the module header, then the route.
pub(super) async fn guard(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get("host")
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()))
        .unwrap_or("");
    if !host_allowed(host, &st.cfg.allowed_hosts) {
        return refuse(
            403,
            format!(
                "Host `{host}` is not allowed: use an IP address or localhost, or start the \
                 server with --allowed-host {}",
                host.split(':').next().unwrap_or(host)
            ),
        );
    }
    let allow = cors(&st, req.headers());
    if req.method() == Method::OPTIONS {
        let Some(origin) = allow else {
            return refuse(
                405,
                "OPTIONS: no cross-origin access is allowed (--cors-origin)".into(),
            );
        };
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert("access-control-allow-origin", origin);
        h.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            "access-control-allow-headers",
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert("access-control-max-age", HeaderValue::from_static("600"));
        h.insert("vary", HeaderValue::from_static("origin"));
        return r;
    }
    if req.method() == Method::POST {
        let ct = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let essence = ct.split(';').next().unwrap_or("").trim();
        if !essence.eq_ignore_ascii_case("application/json") {
            return refuse(
                415,
                format!("Content-Type `{ct}`: request bodies must be sent as `application/json`"),
            );
        }
    }
    let (parts, body) = req.into_parts();
    let limit = st.cfg.body_limit;
    let read = axum::body::to_bytes(body, limit);
    let bytes = match tokio::time::timeout(st.cfg.body_timeout, read).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => {
            let too_big = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            return match too_big {
                true => refuse(413, format!("the request body is over {limit} bytes")),
                false => refuse(400, format!("reading the request body: {e}")),
            };
        }
        Err(_) => {
            let mut r = refuse(
                408,
                format!(
                    "the request body did not arrive within {} s",
                    st.cfg.body_timeout.as_secs()
                ),
            );
            r.headers_mut()
                .insert("connection", HeaderValue::from_static("close"));
            return r;
        }
    };
    let mut r = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if let Some(origin) = allow {
        r.headers_mut()
            .insert("access-control-allow-origin", origin);
        r.headers_mut()
            .insert("vary", HeaderValue::from_static("origin"));
    }
    r
}
