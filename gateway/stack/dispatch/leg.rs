//! One exchange with one engine (a leg: the unified worker, or the prefill or decode side of
//! a PD pair) and its single `kvgate_upstream_requests_total` outcome.
//!
//! Every leg that was started is counted exactly once, when its outcome is known: `ok`,
//! `status_4xx`, `status_5xx`, the error code of a failure (`upstream_unavailable`,
//! `upstream_timeout`, `upstream_protocol_error`, `overloaded`), or `cancelled` when it was
//! dropped unfinished (the other PD leg failed first, or the client went away). So the
//! counter reconciles with what the engines received.
//!
//! A leg of a traced request is also a client span (a child of the server span), and the
//! engine gets a `traceparent` naming that span as its parent ([`Leg::propagation`]).
//!
//! An engine failure (unreachable, timed out, unreadable, 5xx) also counts towards the
//! worker's outlier ejection (a 5xx, which a request's content may provoke, is blamed on
//! the request's tenant: one tenant's alone never ejects, see `routing::health`); successes and guard trips are known only once the guard has
//! read the answer, so `stack::observe::RequestSignals` reports those.

use std::sync::Arc;

use crate::fleet::Worker;
use crate::metrics;
use crate::telemetry::{AttrValue, Propagation, RequestTrace, Span, SpanKind};

/// A started leg; counts its outcome once (on [`Leg::finish`], or as `cancelled` on drop).
#[derive(Debug)]
pub(super) struct Leg {
    worker: Arc<Worker>,
    /// The request's tenant, blamed for a failure its content may have provoked.
    tenant: Option<Arc<str>>,
    outcome: Option<&'static str>,
    /// The leg's span, for traced requests (recorded or only propagated).
    span: Option<Span>,
}

impl Leg {
    /// A leg to `worker` starts now, in `trace` when the request has one.
    pub fn start(
        worker: &Arc<Worker>,
        tenant: Option<&Arc<str>>,
        trace: Option<&Arc<RequestTrace>>,
    ) -> Self {
        let span = trace.map(|trace| {
            let mut span = trace.child("upstream", SpanKind::Client);
            if span.recording() {
                span.attr("kvgate.role", AttrValue::Static(worker.role.as_str()));
                span.attr("kvgate.pool", AttrValue::Str(worker.pool.to_string()));
                span.attr("kvgate.worker", AttrValue::Str(worker.authority.clone()));
            }
            span
        });
        Self {
            worker: worker.clone(),
            tenant: tenant.cloned(),
            outcome: None,
            span,
        }
    }

    /// The `traceparent` (and `tracestate`) the engine gets: its parent is this leg's span.
    pub fn propagation(&self) -> Option<Propagation> {
        self.span.as_ref().and_then(Span::propagation)
    }

    /// The leg's outcome is known; the first one set is the one counted.
    pub fn finish(&mut self, outcome: &'static str) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = Some(outcome);
        match (outcome, &self.tenant) {
            ("status_5xx", Some(tenant)) => self.worker.request_failed_by(outcome, tenant),
            (
                "upstream_unavailable"
                | "upstream_timeout"
                | "upstream_protocol_error"
                | "status_5xx",
                _,
            ) => self.worker.request_failed(outcome),
            _ => {}
        }
    }
}

impl Drop for Leg {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            let outcome = self.outcome.unwrap_or("cancelled");
            span.attr("kvgate.outcome", AttrValue::Static(outcome));
            if !matches!(outcome, "ok" | "status_4xx") {
                span.fail(outcome);
            }
            span.end();
        }
        metrics::per_request::upstream(
            &self.worker.pool,
            self.worker.role.as_str(),
            self.outcome.unwrap_or("cancelled"),
        )
        .increment(1);
    }
}
