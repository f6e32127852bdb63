//! A span as plain data: its kind, attributes and, once finished, everything the exporter
//! encodes. Shared by `span` (which records it), `export` (which queues it) and
//! `otlp_json` (which encodes it), so none of them needs another for its types.

use http::HeaderValue;

use super::context::{SpanId, TraceId};

/// What a span stands for, as OTLP's `SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Work inside the gateway (a stage).
    Internal,
    /// The request as kvgate served it.
    Server,
    /// One exchange with an engine.
    Client,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Static(&'static str),
    Int(i64),
}

/// One attribute.
pub type Attr = (&'static str, AttrValue);

/// A finished span, as the exporter encodes it.
#[derive(Debug, Clone)]
pub struct SpanData {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_id: Option<SpanId>,
    pub trace_state: Option<HeaderValue>,
    pub name: &'static str,
    pub kind: SpanKind,
    /// Unix time, nanoseconds.
    pub start: u64,
    pub end: u64,
    pub attributes: Vec<Attr>,
    /// `Some(message)` marks the span's status as an error.
    pub error: Option<String>,
}
