//! A request's trace and the spans recorded in it.
//!
//! [`RequestTrace`] rides in the request's extensions (an `Arc`), put there by
//! `stack::trace_context` only when the request has a trace: the client sent a valid
//! `traceparent`, or export is on and the request was sampled. Requests without one carry
//! nothing and pay nothing. A trace that is not recorded (export off, or not sampled) still
//! gives each engine exchange a fresh span id, so the `traceparent` sent to engines names
//! a child of the client's span and the trace stays connected through kvgate.
//!
//! Spans are plain data handed to the gateway's own exporter when they end: nothing goes
//! through the process-wide `tracing` subscriber, so several gateways in one process (the
//! tests) each export their own spans.

use http::HeaderValue;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use super::context::{self, SpanId, TraceId};
use super::export::Exporter;
use super::span_data::{Attr, AttrValue, SpanData, SpanKind};

/// The headers an engine exchange carries to continue the trace.
#[derive(Debug, Clone)]
pub struct Propagation {
    pub traceparent: HeaderValue,
    pub tracestate: Option<HeaderValue>,
}

/// A request's trace (a request extension, as `Arc<RequestTrace>`).
#[derive(Debug)]
pub struct RequestTrace {
    pub trace_id: TraceId,
    /// The parent of the gateway's child spans: its server span when recorded, else the
    /// client's own span.
    pub parent: SpanId,
    /// The client's span, parent of the server span (`None` for a trace kvgate started).
    pub client_parent: Option<SpanId>,
    /// Trace flags sent on (`sampled` set when kvgate records).
    pub flags: u8,
    /// The client's `tracestate`, forwarded as is.
    pub tracestate: Option<HeaderValue>,
    /// The gateway's request id, recorded on the server span.
    pub request_id: Option<HeaderValue>,
    /// Where recorded spans go; `None` when the trace is only propagated.
    exporter: Option<Exporter>,
    /// Attributes the stages learn for the server span (tenant, model, pool, ...).
    server_attrs: Mutex<Vec<Attr>>,
}

impl RequestTrace {
    /// A trace that is recorded into `exporter` (or only propagated, without one).
    pub fn new(
        trace_id: TraceId,
        client_parent: Option<SpanId>,
        flags: u8,
        tracestate: Option<HeaderValue>,
        request_id: Option<HeaderValue>,
        exporter: Option<Exporter>,
    ) -> Self {
        let parent = match (&exporter, client_parent) {
            (None, Some(client)) => client,
            _ => SpanId::random(),
        };
        Self {
            trace_id,
            parent,
            client_parent,
            flags,
            tracestate,
            request_id,
            exporter,
            server_attrs: Mutex::new(Vec::new()),
        }
    }

    /// Whether spans of this trace are recorded and exported.
    pub fn recording(&self) -> bool {
        self.exporter.is_some()
    }

    /// The trace id in hex, for logs and audit lines.
    pub fn trace_id_hex(&self) -> String {
        self.trace_id.to_hex()
    }

    /// The server span: its id is [`Self::parent`], its parent the client's span.
    pub fn server_span(&self, name: &'static str) -> Span {
        let mut span = self.start(self.parent, self.client_parent, name, SpanKind::Server);
        if let Some(data) = &mut span.data {
            data.trace_state = self.tracestate.clone();
        }
        span
    }

    /// A child of the server span (or, when not recorded, an id for the engines alone).
    pub fn child(&self, name: &'static str, kind: SpanKind) -> Span {
        self.start(SpanId::random(), Some(self.parent), name, kind)
    }

    fn start(
        &self,
        id: SpanId,
        parent: Option<SpanId>,
        name: &'static str,
        kind: SpanKind,
    ) -> Span {
        let data = self.exporter.as_ref().map(|exporter| {
            (
                exporter.clone(),
                SpanData {
                    trace_id: self.trace_id,
                    span_id: id,
                    parent_id: parent,
                    trace_state: None,
                    name,
                    kind,
                    start: now_nanos(),
                    end: 0,
                    attributes: Vec::new(),
                    error: None,
                },
            )
        });
        let (exporter, data) = match data {
            Some((e, d)) => (Some(e), Some(d)),
            None => (None, None),
        };
        Span {
            trace_id: self.trace_id,
            id,
            flags: self.flags,
            tracestate: self.tracestate.clone(),
            exporter,
            data,
        }
    }

    /// Record `attr` on the server span too (ignored when not recording).
    pub fn server_attr(&self, key: &'static str, value: AttrValue) {
        if self.recording() {
            let mut attrs = self.server_attrs.lock().unwrap_or_else(|p| p.into_inner());
            attrs.push((key, value));
        }
    }

    /// The attributes collected for the server span.
    pub fn take_server_attrs(&self) -> Vec<Attr> {
        std::mem::take(&mut *self.server_attrs.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A started span; it ends (and is exported, when recorded) on [`Span::end`] or drop.
#[derive(Debug)]
pub struct Span {
    trace_id: TraceId,
    id: SpanId,
    flags: u8,
    tracestate: Option<HeaderValue>,
    exporter: Option<Exporter>,
    data: Option<SpanData>,
}

impl Span {
    /// The span's id.
    pub fn id(&self) -> SpanId {
        self.id
    }

    /// Whether this span is recorded.
    pub fn recording(&self) -> bool {
        self.data.is_some()
    }

    /// Headers that make the next hop's span a child of this one.
    pub fn propagation(&self) -> Option<Propagation> {
        Some(Propagation {
            traceparent: context::traceparent(self.trace_id, self.id, self.flags)?,
            tracestate: self.tracestate.clone(),
        })
    }

    /// Set an attribute.
    pub fn attr(&mut self, key: &'static str, value: AttrValue) {
        if let Some(data) = &mut self.data {
            data.attributes.push((key, value));
        }
    }

    /// Set several attributes.
    pub fn attrs(&mut self, attrs: Vec<Attr>) {
        if let Some(data) = &mut self.data {
            data.attributes.extend(attrs);
        }
    }

    /// Mark the span as failed with `message` (the first failure wins).
    pub fn fail(&mut self, message: &str) {
        if let Some(data) = &mut self.data {
            if data.error.is_none() {
                data.error = Some(message.to_owned());
            }
        }
    }

    /// End the span now.
    pub fn end(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let (Some(exporter), Some(mut data)) = (self.exporter.take(), self.data.take()) {
            data.end = now_nanos().max(data.start);
            exporter.send(data);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        self.finish();
    }
}

/// A shared handle to a span that several places may end (the first one does).
pub type SharedSpan = Arc<Mutex<Option<Span>>>;

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}
