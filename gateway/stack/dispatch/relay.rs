//! Turning an engine's answer into the client's: non-2xx becomes a typed error carrying the
//! engine's message (for the log); a stream passes through under its deadlines; a whole body
//! is read within the deadline and the buffer budget.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::leg::Leg;
use super::{DispatchLimits, TargetGuard};
use crate::body::{self, BoxBody, BoxError, GuardBody};
use crate::error::GatewayError;
use crate::fleet::{Pool, Worker};
use crate::load::BufferPermit;
use crate::stack::guard::BufferedAnswer;
use crate::upstream::{self, read_body, Deadlines};

/// How much of an engine's error body is read for its message, and for how long.
const MAX_ERROR_BYTES: usize = 64 * 1024;
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) struct Relay {
    pub stream: bool,
    pub limits: DispatchLimits,
    pub deadlines: Deadlines,
    pub pool: Arc<Pool>,
    /// The gateway's request id, for the log lines written here.
    pub request_id: Option<HeaderValue>,
}

impl Relay {
    /// The client's response from the serving worker's answer; `guard` (the worker loads)
    /// lives as long as the body does.
    /// A failure sets `leg`'s outcome; a stream's success is the caller's to set (a PD
    /// decode stream is `ok` only once its prefill leg succeeded too).
    pub async fn answer(
        &self,
        worker: &Worker,
        leg: &mut Leg,
        response: Result<Response<Incoming>, GatewayError>,
        guard: TargetGuard,
    ) -> Result<Response<BoxBody>, GatewayError> {
        let response = self.check_status(worker, leg, response).await?;
        let (parts, incoming) = response.into_parts();
        let mut buffered = None;
        let body = if self.stream {
            body::boxed(GuardBody::new(self.deadline_body(worker, incoming), guard))
        } else {
            let mut permit = BufferPermit::default();
            let bytes = self.read_whole(worker, leg, incoming, &mut permit).await?;
            buffered = Some(BufferedAnswer(bytes.clone()));
            // The budget's reservation and the loads are held until the client has it.
            body::boxed(GuardBody::new(
                body::ChunkedBytes::new(bytes),
                (guard, permit),
            ))
        };
        let mut out = Response::new(body);
        *out.status_mut() = parts.status;
        if let Some(b) = buffered {
            out.extensions_mut().insert(b);
        }
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

    /// Read the prefill worker's answer to its end (for the guard), with its reservation.
    pub async fn drain_prefill(
        &self,
        worker: &Worker,
        mut leg: Leg,
        response: Result<Response<Incoming>, GatewayError>,
    ) -> Result<(Bytes, BufferPermit), GatewayError> {
        let response = self.check_status(worker, &mut leg, response).await?;
        let mut permit = BufferPermit::default();
        let bytes = self
            .read_whole(worker, &mut leg, response.into_body(), &mut permit)
            .await?;
        Ok((bytes, permit))
    }

    async fn read_whole(
        &self,
        worker: &Worker,
        leg: &mut Leg,
        body: Incoming,
        permit: &mut BufferPermit,
    ) -> Result<Bytes, GatewayError> {
        let limit = self.limits.max_response_bytes;
        let budget = Some((&self.limits.budget, permit));
        let read = read_body(worker, body, limit, self.deadlines.whole, budget).await;
        leg.finish(match &read {
            Ok(_) => "ok",
            Err(e) => e.code(),
        });
        read
    }

    /// A streamed body under the stream deadlines: a silence longer than
    /// `stream_idle` or a stream past the whole-request deadline ends it with an
    /// `UpstreamTimeout` error (the guard turns it into an SSE error event, no `[DONE]`), and
    /// dropping the engine's body closes its connection, which cancels its work.
    fn deadline_body(&self, worker: &Worker, incoming: Incoming) -> BoxBody {
        let idle = self.deadlines.stream_idle;
        let whole = self.deadlines.whole;
        let started = Instant::now();
        let labels = worker_labels(worker);
        let stream = futures_util::stream::unfold(Some(incoming), move |state| {
            let labels = labels.clone();
            async move {
                let mut body = state?;
                let wait_until = (Instant::now() + idle).min(whole);
                match tokio::time::timeout_at(wait_until, body.frame()).await {
                    Ok(Some(Ok(frame))) => Some((Ok(frame), Some(body))),
                    Ok(Some(Err(e))) => Some((Err(BoxError::from(e)), None)),
                    Ok(None) => None,
                    Err(_) => {
                        let waited = if wait_until >= whole {
                            whole.saturating_duration_since(started)
                        } else {
                            idle
                        };
                        let error: BoxError = Box::new(upstream::timeout(labels.as_ref(), waited));
                        Some((Err(error), None))
                    }
                }
            }
        });
        body::boxed(http_body_util::StreamBody::new(stream))
    }

    async fn check_status(
        &self,
        worker: &Worker,
        leg: &mut Leg,
        response: Result<Response<Incoming>, GatewayError>,
    ) -> Result<Response<Incoming>, GatewayError> {
        let response = match response {
            Ok(r) => r,
            Err(e) => {
                leg.finish(e.code());
                return Err(e);
            }
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        leg.finish(if status.is_client_error() {
            "status_4xx"
        } else {
            "status_5xx"
        });
        let deadline = self
            .deadlines
            .whole
            .min(Instant::now() + ERROR_BODY_TIMEOUT);
        let body = read_body(
            worker,
            response.into_body(),
            MAX_ERROR_BYTES,
            deadline,
            None,
        )
        .await
        .unwrap_or_default();
        let message = error_message(status, &body);
        // The engine's own words are for the operator: logged here, never sent to clients.
        tracing::warn!(
            request_id = self
                .request_id
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-"),
            pool = %worker.pool,
            role = worker.role.as_str(),
            worker = %worker.authority,
            %status,
            engine_message = %message,
            "engine answered an error status"
        );
        Err(GatewayError::UpstreamStatus {
            pool: worker.pool.to_string(),
            role: worker.role.as_str(),
            status,
            message,
        })
    }
}

/// The labels of `worker` for errors raised after the borrow of the worker ended.
fn worker_labels(worker: &Worker) -> Arc<upstream::PeerLabels> {
    Arc::new(upstream::PeerLabels::of(worker))
}

/// The engine's own message: OpenAI `{"error":{"message"}}`, SGLang `{"message"}` /
/// `{"error": "..."}`, else the text itself (bounded).
pub(super) fn error_message(status: StatusCode, body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let found = v
            .get("error")
            .and_then(|x| x.get("message"))
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
