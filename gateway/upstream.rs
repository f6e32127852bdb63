//! The pooled HTTP client to engines: one per data thread (`runtime::data_threads`), so a
//! request's engine connection lives on its thread, and one for discovery and probes.
//!
//! Connection errors become 502 `upstream_unavailable`, missed deadlines 504
//! `upstream_timeout`; what the engine said is interpreted by dispatch, not here.
//!
//! An exchange whose pooled connection had served an earlier one and then closed or reset
//! before any byte of the answer came back is sent once more, on a fresh connection, when its
//! caller allows it ([`Replay`]): engines such as llama-server close a keep-alive connection
//! right after a streamed answer, and the next request on it would otherwise be a 502.

mod reuse;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderValue, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{capture_connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use crate::config::UpstreamConfig;
use crate::error::{error_chain, GatewayError};
use crate::load::{BufferBudget, BufferPermit};
use crate::telemetry::context::{TRACEPARENT, TRACESTATE};
use crate::telemetry::Propagation;
use crate::tls::EngineTls;

/// The shared upstream client.
#[derive(Clone, Debug)]
pub struct Upstream {
    /// Behind an `Arc`: the stack clones its services per request, and a hyper client is
    /// several reference counts of its own.
    client: Arc<Client<Connector, Full<Bytes>>>,
    /// Keeps no idle connection: every exchange on it opens a new one (the one retry after
    /// a stale pooled connection).
    fresh: Arc<Client<Connector, Full<Bytes>>>,
    request_timeout: Duration,
    response_header_timeout: Duration,
    stream_idle_timeout: Duration,
}

type Connector = reuse::Counting<HttpsConnector<HttpConnector>>;

/// Whether a failed exchange may be sent again on a fresh connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replay {
    /// Once, when its pooled connection had served an earlier exchange and closed or reset
    /// before any byte of this answer: the idle-connection race (nginx and Envoy retry it
    /// too). The engine may, rarely, have read the request and died; a second run of a
    /// unified generation costs compute, never a second answer to the client.
    StaleConnection,
    /// Never: a disaggregated leg carries a bootstrap room, and a leg the engine read may
    /// already have claimed it, so sending it again could pair with the wrong peer.
    Never,
}

/// The deadlines of one exchange with an engine.
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// The whole exchange, streams included (`upstream.request_timeout`).
    pub whole: Instant,
    /// Until the response headers: for streams `upstream.response_header_timeout`; a
    /// non-streamed answer's headers come with its body, so `whole` bounds them.
    pub headers: Instant,
    /// Longest silence between two stream chunks (`upstream.stream_idle_timeout`).
    pub stream_idle: Duration,
}

impl Upstream {
    /// Build the client from `[upstream]`; `https://` workers are reached with `tls`.
    pub fn new(config: &UpstreamConfig, tls: &EngineTls) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        // The TLS layer above decides by scheme.
        connector.enforce_http(false);
        let connector = reuse::Counting(tls.connector(connector));
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.idle_timeout)
            .pool_max_idle_per_host(config.max_idle_per_host)
            .build(connector.clone());
        let fresh = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Self {
            client: Arc::new(client),
            fresh: Arc::new(fresh),
            request_timeout: config.request_timeout,
            response_header_timeout: config.response_header_timeout,
            stream_idle_timeout: config.stream_idle_timeout,
        }
    }

    /// The deadline for one exchange starting now.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.request_timeout
    }

    /// The deadlines of an exchange starting now.
    pub fn deadlines(&self, stream: bool) -> Deadlines {
        let now = Instant::now();
        let whole = now + self.request_timeout;
        Deadlines {
            whole,
            headers: if stream {
                whole.min(now + self.response_header_timeout)
            } else {
                whole
            },
            stream_idle: self.stream_idle_timeout,
        }
    }

    /// POST a JSON body to `worker` and wait (until `deadline`) for the response headers;
    /// `trace` continues the request's trace (W3C `traceparent`, `tracestate`); `replay`
    /// says whether a stale pooled connection may be retried.
    #[allow(clippy::too_many_arguments)]
    pub async fn post_json(
        &self,
        worker: &dyn Peer,
        path: &str,
        body: Bytes,
        request_id: Option<&HeaderValue>,
        trace: Option<&Propagation>,
        deadline: Instant,
        replay: Replay,
    ) -> Result<Response<Incoming>, GatewayError> {
        let uri = format!("{}{}", worker.base_url(), path);
        // Built again only for a retry (the body is bytes already in memory), so the usual
        // exchange keeps no second copy of its request.
        let make = || {
            let mut builder = Request::builder()
                .method(Method::POST)
                .uri(uri.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "application/json, text/event-stream");
            if let Some(id) = request_id {
                builder = builder.header("x-request-id", id);
            }
            if let Some(trace) = trace {
                builder = builder.header(TRACEPARENT, &trace.traceparent);
                if let Some(state) = &trace.tracestate {
                    builder = builder.header(TRACESTATE, state);
                }
            }
            builder
                .body(Full::new(body.clone()))
                .map_err(|e| GatewayError::Internal(format!("building upstream request: {e}")))
        };
        self.send(worker, make, deadline, replay).await
    }

    /// GET `path` from `worker` (discovery probes).
    pub async fn get(
        &self,
        worker: &dyn Peer,
        path: &str,
        deadline: Instant,
    ) -> Result<Response<Incoming>, GatewayError> {
        let uri = format!("{}{}", worker.base_url(), path);
        let make = || {
            Request::builder()
                .method(Method::GET)
                .uri(uri.as_str())
                .body(Full::new(Bytes::new()))
                .map_err(|e| GatewayError::Internal(format!("building upstream request: {e}")))
        };
        self.send(worker, make, deadline, Replay::StaleConnection)
            .await
    }

    async fn send(
        &self,
        worker: &dyn Peer,
        make: impl Fn() -> Result<Request<Full<Bytes>>, GatewayError>,
        deadline: Instant,
        replay: Replay,
    ) -> Result<Response<Incoming>, GatewayError> {
        let started = Instant::now();
        let mut request = make()?;
        let captured = capture_connection(&mut request);
        let first = tokio::time::timeout_at(deadline, self.client.request(request)).await;
        let reused = captured
            .connection_metadata()
            .as_ref()
            .and_then(reuse::uses_of)
            .is_some_and(|uses| uses.mark());
        let e = match first {
            Ok(Ok(response)) => return Ok(response),
            Ok(Err(e)) => e,
            Err(_) => return Err(timeout(worker, deadline.saturating_duration_since(started))),
        };
        if replay != Replay::StaleConnection || !reused || !reuse::stale_connection(&e) {
            return Err(unavailable(worker, &e));
        }
        let again = make()?;
        tracing::debug!(
            worker = worker.authority(),
            error = %error_chain(&e),
            "the pooled connection closed before any answer byte; retrying on a fresh one"
        );
        ::metrics::counter!(
            crate::metrics::UPSTREAM_RETRIES_TOTAL,
            "pool" => worker.pool().to_string(),
            "reason" => "stale_connection"
        )
        .increment(1);
        match tokio::time::timeout_at(deadline, self.fresh.request(again)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(e)) => Err(unavailable(worker, &e)),
            Err(_) => Err(timeout(worker, deadline.saturating_duration_since(started))),
        }
    }
}

fn unavailable(worker: &dyn Peer, e: &hyper_util::client::legacy::Error) -> GatewayError {
    GatewayError::UpstreamUnavailable {
        pool: worker.pool().to_string(),
        role: worker.role(),
        worker: worker.authority().to_owned(),
        detail: error_chain(e),
        connect: e.is_connect(),
    }
}

/// Who an exchange goes to: its base URL and the labels its errors carry. Routing's
/// `Worker` is one; the client needs nothing else of it (so it does not depend on routing).
pub trait Peer: Send + Sync {
    /// `http://host:port`, no trailing slash.
    fn base_url(&self) -> &str;
    /// The pool the peer belongs to.
    fn pool(&self) -> &str;
    /// `prefill`, `decode` or `unified`.
    fn role(&self) -> &'static str;
    /// `host:port`, for errors and logs.
    fn authority(&self) -> &str;
}

impl<T: Peer + ?Sized> Peer for std::sync::Arc<T> {
    fn base_url(&self) -> &str {
        (**self).base_url()
    }
    fn pool(&self) -> &str {
        (**self).pool()
    }
    fn role(&self) -> &'static str {
        (**self).role()
    }
    fn authority(&self) -> &str {
        (**self).authority()
    }
}

/// A peer's labels, owned: for errors raised after the borrow of the peer ended (a
/// stream's deadline fires long after dispatch returned).
#[derive(Debug, Clone)]
pub struct PeerLabels {
    base_url: String,
    pool: String,
    role: &'static str,
    authority: String,
}

impl PeerLabels {
    /// The labels of `peer`.
    pub fn of(peer: &dyn Peer) -> Self {
        Self {
            base_url: peer.base_url().to_owned(),
            pool: peer.pool().to_owned(),
            role: peer.role(),
            authority: peer.authority().to_owned(),
        }
    }
}

impl Peer for PeerLabels {
    fn base_url(&self) -> &str {
        &self.base_url
    }
    fn pool(&self) -> &str {
        &self.pool
    }
    fn role(&self) -> &'static str {
        self.role
    }
    fn authority(&self) -> &str {
        &self.authority
    }
}

/// Read a whole upstream body, at most `limit` bytes, before `deadline`; every chunk is
/// reserved in `permit` from `budget` first (503 `overloaded` when the budget is full).
pub async fn read_body(
    worker: &dyn Peer,
    body: Incoming,
    limit: usize,
    deadline: Instant,
    budget: Option<(&BufferBudget, &mut BufferPermit)>,
) -> Result<Bytes, GatewayError> {
    let started = Instant::now();
    let mut body = std::pin::pin!(body);
    let mut buf = BytesMut::new();
    let mut budget = budget;
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => frame,
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(Err(e))) => {
                return Err(GatewayError::UpstreamProtocol {
                    pool: worker.pool().to_string(),
                    role: worker.role(),
                    detail: format!("reading the response body failed: {}", error_chain(&e)),
                })
            }
            Err(_) => return Err(timeout(worker, deadline.saturating_duration_since(started))),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(GatewayError::UpstreamProtocol {
                pool: worker.pool().to_string(),
                role: worker.role(),
                detail: format!(
                    "the answer is larger than upstream.max_response_bytes ({limit} bytes)"
                ),
            });
        }
        if let Some((budget, permit)) = budget.as_mut() {
            if !budget.reserve(permit, len as u64) {
                ::metrics::counter!(crate::metrics::LOAD_SHED_TOTAL, "ceiling" => "buffered_bytes")
                    .increment(1);
                return Err(GatewayError::Overloaded {
                    ceiling: "buffered answer bytes",
                });
            }
        }
        buf.extend_from_slice(&data);
    }
}

pub(crate) fn timeout(worker: &dyn Peer, timeout: Duration) -> GatewayError {
    GatewayError::UpstreamTimeout {
        pool: worker.pool().to_string(),
        role: worker.role(),
        worker: worker.authority().to_owned(),
        timeout,
    }
}
