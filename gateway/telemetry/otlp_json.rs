//! OTLP/JSON encoding of finished spans: an `ExportTraceServiceRequest` as the OTLP
//! specification's JSON mapping writes it (ids as lowercase hex, 64-bit integers and
//! timestamps as strings, enums as numbers, camelCase keys).

use serde_json::{json, Value};

use super::span_data::{AttrValue, SpanData, SpanKind};

/// The instrumentation scope kvgate's spans are reported under.
const SCOPE: &str = "kvgate";

/// One `ExportTraceServiceRequest` holding `spans` of `service_name`.
pub fn encode(service_name: &str, spans: &[SpanData]) -> Vec<u8> {
    let spans: Vec<Value> = spans.iter().map(span).collect();
    let request = json!({
        "resourceSpans": [{
            "resource": {
                "attributes": [attribute("service.name", &AttrValue::Str(service_name.to_owned()))]
            },
            "scopeSpans": [{
                "scope": { "name": SCOPE, "version": env!("CARGO_PKG_VERSION") },
                "spans": spans
            }]
        }]
    });
    serde_json::to_vec(&request).unwrap_or_default()
}

fn span(span: &SpanData) -> Value {
    let mut out = json!({
        "traceId": span.trace_id.to_hex(),
        "spanId": span.span_id.to_hex(),
        "name": span.name,
        "kind": kind(span.kind),
        "startTimeUnixNano": span.start.to_string(),
        "endTimeUnixNano": span.end.to_string(),
        "attributes": span.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        // STATUS_CODE_ERROR = 2, STATUS_CODE_UNSET = 0.
        "status": match &span.error {
            Some(message) => json!({ "code": 2, "message": message }),
            None => json!({}),
        },
    });
    if let Some(parent) = span.parent_id {
        out["parentSpanId"] = Value::from(parent.to_hex());
    }
    if let Some(state) = span.trace_state.as_ref().and_then(|s| s.to_str().ok()) {
        out["traceState"] = Value::from(state);
    }
    out
}

fn kind(kind: SpanKind) -> u8 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
    }
}

fn attribute(key: &str, value: &AttrValue) -> Value {
    let value = match value {
        AttrValue::Str(s) => json!({ "stringValue": s }),
        AttrValue::Static(s) => json!({ "stringValue": s }),
        AttrValue::Int(i) => json!({ "intValue": i.to_string() }),
    };
    json!({ "key": key, "value": value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::context::{SpanId, TraceId};

    #[test]
    fn spans_encode_as_otlp_json() {
        let data = SpanData {
            trace_id: TraceId([1; 16]),
            span_id: SpanId([2; 8]),
            parent_id: Some(SpanId([3; 8])),
            trace_state: None,
            name: "admission",
            kind: SpanKind::Internal,
            start: 10,
            end: 20,
            attributes: vec![("kvgate.prompt_tokens", AttrValue::Int(7))],
            error: Some("context_length_exceeded".into()),
        };
        let body: Value = serde_json::from_slice(&encode("kvgate", &[data])).unwrap();
        let rs = &body["resourceSpans"][0];
        assert_eq!(
            rs["resource"]["attributes"][0]["value"]["stringValue"],
            "kvgate"
        );
        let s = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(s["traceId"], "01010101010101010101010101010101");
        assert_eq!(s["spanId"], "0202020202020202");
        assert_eq!(s["parentSpanId"], "0303030303030303");
        assert_eq!(s["kind"], 1);
        assert_eq!(s["startTimeUnixNano"], "10");
        assert_eq!(s["attributes"][0]["value"]["intValue"], "7");
        assert_eq!(s["status"]["code"], 2);
    }
}
