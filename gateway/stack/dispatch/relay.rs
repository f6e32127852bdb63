//! Turning an engine's answer into the client's: non-2xx becomes a typed error carrying the
//! engine's message; a stream passes through; a whole body is read within the deadline.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::Value;
use std::sync::Arc;
use tokio::time::Instant;

use super::{DispatchLimits, TargetGuard};
use crate::body::{self, BoxBody, GuardBody};
use crate::error::GatewayError;
use crate::metrics;
use crate::stack::routing::{Pool, Worker};
use crate::upstream::read_body;

/// How much of an engine's error body is read for its message.
const MAX_ERROR_BYTES: usize = 64 * 1024;

pub(super) struct Relay {
    pub stream: bool,
    pub limits: DispatchLimits,
    pub deadline: Instant,
    pub pool: Arc<Pool>,
    pub guard: TargetGuard,
}

impl Relay {
    /// The client's response from the serving worker's answer.
    pub async fn answer(
        &self,
        worker: &Worker,
        response: Result<Response<Incoming>, GatewayError>,
    ) -> Result<Response<BoxBody>, GatewayError> {
        let response = self.check_status(worker, response).await?;
        let (parts, incoming) = response.into_parts();
        let body = if self.stream {
            body::boxed(GuardBody::new(incoming, self.guard.clone()))
        } else {
            let bytes = self.read_whole(worker, incoming).await?;
            body::boxed(GuardBody::new(
                http_body_util::Full::new(bytes),
                self.guard.clone(),
            ))
        };
        let mut out = Response::new(body);
        *out.status_mut() = parts.status;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .cloned()
            .unwrap_or_else(|| {
                HeaderValue::from_static(if self.stream {
                    "text/event-stream"
                } else {
                    "application/json"
                })
            });
        out.headers_mut().insert(header::CONTENT_TYPE, content_type);
        if self.stream {
            out.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        }
        if let Ok(pool) = HeaderValue::from_str(&self.pool.name) {
            out.headers_mut().insert("x-kvgate-pool", pool);
        }
        Ok(out)
    }

    /// Read the prefill worker's answer to its end; only its success matters.
    pub async fn drain_prefill(
        &self,
        worker: &Worker,
        response: Result<Response<Incoming>, GatewayError>,
    ) -> Result<Bytes, GatewayError> {
        let response = self.check_status(worker, response).await?;
        self.read_whole(worker, response.into_body()).await
    }

    async fn read_whole(&self, worker: &Worker, body: Incoming) -> Result<Bytes, GatewayError> {
        let limit = self.limits.max_response_bytes;
        read_body(worker, body, limit, self.deadline, self.timeout())
            .await
            .inspect_err(|_| {
                count(worker, "body_error");
            })
    }

    fn timeout(&self) -> std::time::Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    async fn check_status(
        &self,
        worker: &Worker,
        response: Result<Response<Incoming>, GatewayError>,
    ) -> Result<Response<Incoming>, GatewayError> {
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                count(worker, e.code());
                return Err(e);
            }
        };
        let status = response.status();
        if status.is_success() {
            count(worker, "ok");
            return Ok(response);
        }
        count(
            worker,
            if status.is_client_error() {
                "status_4xx"
            } else {
                "status_5xx"
            },
        );
        let body = read_body(
            worker,
            response.into_body(),
            MAX_ERROR_BYTES,
            self.deadline,
            self.timeout(),
        )
        .await
        .unwrap_or_default();
        Err(GatewayError::UpstreamStatus {
            pool: worker.pool.to_string(),
            role: worker.role.as_str(),
            status,
            message: error_message(status, &body),
        })
    }
}

fn count(worker: &Worker, outcome: &'static str) {
    ::metrics::counter!(
        metrics::UPSTREAM_REQUESTS_TOTAL,
        "pool" => worker.pool.to_string(),
        "role" => worker.role.as_str(),
        "outcome" => outcome
    )
    .increment(1);
}

/// The engine's own message: OpenAI `{"error":{"message"}}`, SGLang `{"message"}` /
/// `{"error": "..."}`, else the text itself (bounded).
pub(super) fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let found = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .or_else(|| v.get("detail"))
            .and_then(Value::as_str);
        if let Some(m) = found {
            return m.to_owned();
        }
    }
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() {
        status.canonical_reason().unwrap_or("no message").to_owned()
    } else {
        text.chars().take(500).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_messages_are_extracted_from_every_shape() {
        let s = StatusCode::BAD_REQUEST;
        assert_eq!(
            error_message(s, br#"{"error":{"message":"too long"}}"#),
            "too long"
        );
        assert_eq!(
            error_message(s, br#"{"object":"error","message":"bad"}"#),
            "bad"
        );
        assert_eq!(error_message(s, br#"{"error":"plain"}"#), "plain");
        assert_eq!(error_message(s, b"oops"), "oops");
        assert_eq!(error_message(s, b""), "Bad Request");
    }
}
