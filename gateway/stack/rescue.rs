//! Rescue: the outermost gateway layer. Turns every error raised below into its HTTP
//! response (through [`GatewayError::into_response`], the one place that builds error
//! bodies) and counts each request's single outcome (I6), in the metrics and in the
//! status page's recent [`Activity`]. The stack above it is infallible.
//!
//! Writes: the request's [`Ledger`] (per-tenant accounting), settled here for a whole
//! answer and at the end of a stream.

use http::Request;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use crate::accounting::{Accounting, Ledger, Outcome};
use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::error::{ErrorDialect, GatewayError};
use crate::metrics;
use crate::stack::api::Endpoint;
use crate::stack::guard::OutcomeAtStreamEnd;
use crate::stack::request_id::RequestId;
use crate::stack::shell::{BoxedWrap, Inner, ShellFuture, ShellLayer};
use crate::stack::trace_context::ErrorCode;
use crate::telemetry::RequestTrace;

/// Errors → responses, plus outcome metrics.
#[derive(Debug, Clone)]
pub struct Rescue {
    sinks: Arc<Sinks>,
}

/// Where outcomes go. One `Arc` for both, so each request clones one pointer, as it did
/// when the audit log was the only sink.
#[derive(Debug)]
struct Sinks {
    audit: AuditLog,
    activity: Arc<Activity>,
    accounting: Arc<Accounting>,
}

impl Rescue {
    /// Rescue, writing request outcomes to `audit`, counting them in `activity` and in
    /// the tenants' series of `accounting`.
    pub fn layer(
        audit: AuditLog,
        activity: Arc<Activity>,
        accounting: Arc<Accounting>,
    ) -> ShellLayer<Self> {
        ShellLayer::new(Self {
            sinks: Arc::new(Sinks {
                audit,
                activity,
                accounting,
            }),
        })
    }
}

// === impl Rescue ===

impl BoxedWrap for Rescue {
    type Error = Infallible;

    fn call<S: Inner<B>, B: Send + 'static>(
        &self,
        inner: &S,
        mut request: Request<B>,
    ) -> ShellFuture<Infallible> {
        let inner = inner.clone();
        let classified = Endpoint::classify(request.method(), request.uri().path()).ok();
        let endpoint = classified.map_or("other", Endpoint::label);
        let dialect = if classified.is_some_and(Endpoint::is_anthropic) {
            ErrorDialect::Anthropic
        } else {
            ErrorDialect::OpenAi
        };
        let started = Instant::now();
        let sinks = self.sinks.clone();
        let request_id = RequestId::of(&request).cloned();
        // The client's own id (stack::request_id moved it here): logged, never forwarded.
        let client_request_id = request
            .headers()
            .get("x-client-request-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // Traced requests only (stack::trace_context): their logs and audit lines name the
        // trace, and their server span gets the error code.
        let trace = request.extensions().get::<Arc<RequestTrace>>().cloned();
        // One account per request (an allocation and a read lock): the stages below name
        // it, the guard fills it in, and it is settled once.
        let ledger = Ledger::new(sinks.accounting.book());
        request.extensions_mut().insert(ledger.clone());
        Box::pin(async move {
            use tower::ServiceExt;
            let mut code = None;
            let response = match inner.oneshot(request).await {
                Ok(response) => response,
                Err(error) => {
                    let error = GatewayError::from_boxed(error);
                    code = Some(error.code());
                    ::metrics::counter!(metrics::ERRORS_TOTAL, "code" => error.code()).increment(1);
                    // The full story (workers, causes) is logged; the client gets the
                    // short message and the id to quote.
                    let id = request_id.as_ref().map_or("-", RequestId::as_str);
                    let client = client_request_id.as_deref().unwrap_or("-");
                    let trace_id = trace.as_ref().map(|t| t.trace_id_hex());
                    let trace_id = trace_id.as_deref().unwrap_or("-");
                    if error.status().is_server_error() {
                        tracing::warn!(%error, code = error.code(), request_id = id, client_request_id = client, trace_id, "request failed");
                    } else {
                        tracing::debug!(%error, code = error.code(), request_id = id, client_request_id = client, trace_id, "request refused");
                    }
                    let code = error.code();
                    let mut response =
                        error.into_response_as(request_id.as_ref().map(RequestId::as_str), dialect);
                    if trace.is_some() {
                        response.extensions_mut().insert(ErrorCode(code));
                    }
                    response
                }
            };
            metrics::per_request::requests(endpoint, response.status().as_u16()).increment(1);
            metrics::per_request::duration(endpoint).record(started.elapsed().as_secs_f64());
            // Exactly one outcome per request (I6): streams count theirs when they end.
            if response.extensions().get::<OutcomeAtStreamEnd>().is_none() {
                let outcome = if code.is_some() { "error" } else { "success" };
                ledger.outcome_unless_set(code.map_or(Outcome::Ok, Outcome::of_error_code));
                let streamed = response
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
                // A stream the guard does not follow to its end (a pool with its guard and
                // leak scan both off) settles when its body lets the account go; every
                // other answer is complete now.
                if !streamed {
                    ledger.settle();
                }
                match code {
                    Some(code) => sinks.activity.refuse(code),
                    None => sinks.activity.admit(),
                }
                metrics::per_request::outcome(outcome).increment(1);
                // A slice, not a map: the line is written field by field, nothing is hashed.
                let mut fields: Vec<(&str, serde_json::Value)> = Vec::with_capacity(8);
                fields.push(("endpoint", endpoint.into()));
                fields.push(("status", response.status().as_u16().into()));
                fields.push(("outcome", outcome.into()));
                fields.push(("code", code.into()));
                fields.push((
                    "request_id",
                    request_id.as_ref().map(RequestId::as_str).into(),
                ));
                if let Some(client) = client_request_id {
                    fields.push(("client_request_id", client.into()));
                }
                if let Some(trace) = &trace {
                    fields.push(("trace_id", trace.trace_id_hex().into()));
                }
                if let Some(pool) = response
                    .headers()
                    .get("x-kvgate-pool")
                    .and_then(|v| v.to_str().ok())
                {
                    fields.push(("pool", pool.into()));
                }
                ledger.snapshot().audit_fields(&mut fields);
                sinks
                    .audit
                    .record_with("request", &serde_json::Map::new(), &fields);
            }
            Ok(response)
        })
    }
}
