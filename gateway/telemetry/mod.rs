//! OpenTelemetry traces: W3C trace context in and out, spans per stage, OTLP/JSON export.
//!
//! Off unless `[tracing] otlp_endpoint` is set; even then a request is traced only when it
//! was sampled. What each part does:
//!
//! - `context`: trace and span ids, parsing and writing `traceparent` / `tracestate`;
//! - `span`: a request's trace (a request extension) and its spans;
//! - `span_data`: a span as plain data (kind, attributes, the finished span);
//! - `export`: the bounded queue and the background task that batches and POSTs spans;
//! - `otlp_json`: the OTLP/JSON encoding of a batch.
//!
//! The stack uses it in three places: `stack::trace_context` (the server span, and the
//! trace a request carries), `stack::stage_span` (one span per stage, wrapped around the
//! stages in `build_stack`) and dispatch (one client span per engine exchange, whose id the
//! engine receives as its `traceparent` parent).
//!
//! Spans never go through the process-wide `tracing` subscriber: each gateway has its own
//! exporter and each request its own [`RequestTrace`], so several gateways in one process
//! export independently, and a request without a trace pays one header lookup.

pub mod context;
pub mod export;
pub mod otlp_json;
pub mod span;
pub mod span_data;

use http::{HeaderMap, HeaderValue};
use std::sync::Arc;

use crate::config::TracingConfig;
use context::{TraceId, TraceParent, SAMPLED};
use export::{ExportTask, Exporter};
pub use span::{Propagation, RequestTrace, Span};
pub use span_data::{AttrValue, SpanKind};

/// A gateway's tracing: whether spans are exported, and how new traces are sampled.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    exporter: Option<Exporter>,
    /// New traces whose id's low 64 bits fall below this are sampled.
    sample_below: u64,
    /// `sample_ratio = 1.0`: every new trace (the bound above cannot express it).
    sample_all: bool,
}

impl Telemetry {
    /// Tracing as configured, and the export task to spawn when export is on.
    pub fn from_config(config: &TracingConfig) -> (Self, Option<ExportTask>) {
        let (exporter, task) = match export::exporter(config) {
            Some((exporter, task)) => (Some(exporter), Some(task)),
            None => (None, None),
        };
        let ratio = config.sample_ratio.clamp(0.0, 1.0);
        let telemetry = Self {
            exporter,
            sample_below: (ratio * u64::MAX as f64) as u64,
            sample_all: ratio >= 1.0,
        };
        (telemetry, task)
    }

    /// The trace of a request with these headers, if it has one: the client's (recorded
    /// when export is on and the client sampled it, else only propagated), or a new one
    /// when export is on and the ratio samples it. `None` costs nothing further.
    pub fn trace_for(
        &self,
        headers: &HeaderMap,
        request_id: Option<&HeaderValue>,
    ) -> Option<Arc<RequestTrace>> {
        let client = TraceParent::from_headers(headers);
        if client.is_none() && self.exporter.is_none() {
            return None;
        }
        let request_id = request_id.cloned();
        let trace = match client {
            Some(parent) => {
                // Parent-based sampling: the client's sampled flag decides for its trace.
                let exporter = self.exporter.clone().filter(|_| parent.sampled());
                RequestTrace::new(
                    parent.trace_id,
                    Some(parent.parent_id),
                    parent.flags,
                    context::tracestate(headers),
                    request_id,
                    exporter,
                )
            }
            None => {
                let trace_id = TraceId::random();
                if !self.sample_all && trace_id.low_u64() >= self.sample_below {
                    return None;
                }
                RequestTrace::new(
                    trace_id,
                    None,
                    SAMPLED,
                    None,
                    request_id,
                    self.exporter.clone(),
                )
            }
        };
        Some(Arc::new(trace))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    const CLIENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn with_traceparent(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(context::TRACEPARENT, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn off_traces_nothing_without_a_client_traceparent() {
        let telemetry = Telemetry::default();
        assert!(telemetry.trace_for(&HeaderMap::new(), None).is_none());
        assert!(telemetry
            .trace_for(&with_traceparent("junk"), None)
            .is_none());
    }

    #[test]
    fn off_propagates_a_child_of_the_clients_span() {
        let telemetry = Telemetry::default();
        let trace = telemetry
            .trace_for(&with_traceparent(CLIENT), None)
            .unwrap();
        assert!(!trace.recording());
        let leg = trace.child("upstream", SpanKind::Client);
        let sent = leg.propagation().unwrap().traceparent;
        let sent = TraceParent::parse(&sent).unwrap();
        assert_eq!(sent.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(sent.parent_id.to_hex(), "00f067aa0ba902b7");
        assert!(sent.sampled());
    }

    #[test]
    fn a_zero_ratio_samples_no_new_trace() {
        let config = TracingConfig {
            otlp_endpoint: Some("http://127.0.0.1:4318".into()),
            sample_ratio: 0.0,
            ..TracingConfig::default()
        };
        // The export task is not spawned: nothing is exported in this test.
        let (telemetry, _task) = Telemetry::from_config(&config);
        assert!(telemetry.trace_for(&HeaderMap::new(), None).is_none());
        // A client's sampled trace is still recorded (parent-based).
        let trace = telemetry
            .trace_for(&with_traceparent(CLIENT), None)
            .unwrap();
        assert!(trace.recording());
    }
}
