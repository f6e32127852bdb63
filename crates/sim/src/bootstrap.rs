//! The bootstrap protocol: how a decode collects a room's KV from its prefill.
//!
//! HTTP/1.1 on the prefill's bootstrap listener:
//!
//! - `GET /rooms/{room}?wait_ms=N` long-polls up to `N` ms (default 0, at most 60 000) for
//!   the room to be published, then answers
//!   - `200 {"room", "status": "ready", "tokens": [...], "prompt_tokens", "cached_tokens"}`:
//!     the KV content (token ids standing in for KV vectors), the prompt's length and the
//!     part of it the prefill found in its prefix cache. Handing it out frees the
//!     prefill's pages.
//!   - `200 {"room", "status": "aborted", "message", "status_code", "err_type"}`
//!   - `404 {"room", "status": "pending"}` when nothing was published within the wait.
//! - `GET /health` → `200 {"status": "ok"}`.
//!
//! Waiting uses the room's `watch` channel, never a polling loop.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::json;

use super::listen::{json_response, Body, ResetConnection};
use super::rooms::{AbortInfo, RoomState, Rooms};
use super::stats::{bump, SimStats};

/// Longest long-poll a bootstrap client may ask for.
const MAX_WAIT_MS: u64 = 60_000;

/// HTTP client a decode uses to reach prefill bootstrap servers.
pub(crate) type BootstrapClient = Client<HttpConnector, Empty<Bytes>>;

/// A client with pooled connections.
pub(crate) fn client() -> BootstrapClient {
    Client::builder(hyper_util::rt::TokioExecutor::new()).build_http()
}

/// Handles one request on the bootstrap listener.
pub(crate) async fn handle(
    rooms: Arc<Rooms>,
    stats: Arc<SimStats>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let path = req.uri().path();
    if path == "/health" {
        return Ok(json_response(StatusCode::OK, &json!({"status": "ok"})));
    }
    let Some(room) = path
        .strip_prefix("/rooms/")
        .and_then(|r| r.parse::<u64>().ok())
    else {
        return Ok(json_response(
            StatusCode::NOT_FOUND,
            &json!({"detail": "Not Found"}),
        ));
    };
    let wait_ms = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("wait_ms="))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        .min(MAX_WAIT_MS);
    let response = match rooms.take(room, Duration::from_millis(wait_ms)).await {
        Some(RoomState::Ready {
            tokens,
            prompt_tokens,
            cached_tokens,
        }) => {
            bump(&stats.kv_transfers);
            json_response(
                StatusCode::OK,
                &json!({"room": room, "status": "ready", "tokens": *tokens,
                        "prompt_tokens": prompt_tokens, "cached_tokens": cached_tokens}),
            )
        }
        Some(RoomState::Aborted(abort)) => json_response(
            StatusCode::OK,
            &json!({"room": room, "status": "aborted", "message": abort.message,
                    "status_code": abort.status_code, "err_type": abort.err_type}),
        ),
        Some(RoomState::Pending) | None => json_response(
            StatusCode::NOT_FOUND,
            &json!({"room": room, "status": "pending"}),
        ),
    };
    Ok(response)
}

/// Why a decode could not get its room.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("bootstrap request failed: {0}")]
    Transport(String),
    #[error("room not published in time")]
    NotPublished,
    #[error("bootstrap server answered {0}")]
    Malformed(String),
}

/// Fetches `room` from the bootstrap server at `host:port`, waiting up to `wait`.
pub(crate) async fn fetch(
    client: &BootstrapClient,
    host: &str,
    port: u16,
    room: u64,
    wait: Duration,
) -> Result<RoomState, FetchError> {
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let uri = format!(
        "http://{host}:{port}/rooms/{room}?wait_ms={}",
        wait.as_millis()
    );
    let uri: hyper::Uri = uri
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| FetchError::Transport(e.to_string()))?;
    // The server bounds its own wait; this outer bound covers a dead or silent server.
    let call = async {
        let response = client
            .get(uri)
            .await
            .map_err(|e| FetchError::Transport(e.to_string()))?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| FetchError::Transport(e.to_string()))?
            .to_bytes();
        Ok::<_, FetchError>((status, body))
    };
    let (status, body) = tokio::time::timeout(wait + Duration::from_secs(1), call)
        .await
        .map_err(|_| FetchError::NotPublished)??;
    if status == StatusCode::NOT_FOUND {
        return Err(FetchError::NotPublished);
    }
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| FetchError::Malformed(e.to_string()))?;
    match value.get("status").and_then(|s| s.as_str()) {
        Some("ready") => {
            let tokens = value
                .get("tokens")
                .and_then(|t| t.as_array())
                .ok_or_else(|| FetchError::Malformed("no tokens".into()))?
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| FetchError::Malformed("bad token".into()))?;
            let prompt_tokens = value
                .get("prompt_tokens")
                .and_then(|p| p.as_u64())
                .map_or(tokens.len(), |p| usize::try_from(p).unwrap_or(usize::MAX));
            // Absent (an older prefill): nothing was found cached.
            let cached_tokens = value
                .get("cached_tokens")
                .and_then(|c| c.as_u64())
                .map_or(0, |c| usize::try_from(c).unwrap_or(usize::MAX));
            Ok(RoomState::Ready {
                tokens: Arc::new(tokens),
                prompt_tokens,
                cached_tokens,
            })
        }
        Some("aborted") => Ok(RoomState::Aborted(AbortInfo {
            message: value
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("aborted by prefill")
                .to_string(),
            status_code: value
                .get("status_code")
                .and_then(|s| s.as_u64())
                .and_then(|s| u16::try_from(s).ok()),
            err_type: value
                .get("err_type")
                .and_then(|e| e.as_str())
                .map(str::to_string),
        })),
        _ => Err(FetchError::Malformed(format!("status {status}"))),
    }
}
