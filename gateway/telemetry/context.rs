//! W3C Trace Context: trace and span ids, and the `traceparent` / `tracestate` headers.
//!
//! A client's `traceparent` is accepted only when it is well formed (version, lowercase
//! hex, ids not all zero, as the W3C recommendation says); anything else is ignored, never
//! an error, and the request starts a trace of its own when export is on.

use http::{HeaderMap, HeaderName, HeaderValue};
use std::fmt::Write;

use crate::secure_random;

/// The W3C `traceparent` header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// The W3C `tracestate` header.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The `sampled` trace flag.
pub const SAMPLED: u8 = 0x01;

/// Longest `tracestate` forwarded (the recommendation's minimum that must be propagated).
const MAX_TRACESTATE_BYTES: usize = 512;

/// A 128-bit trace id (never all zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId(pub [u8; 16]);

/// A 64-bit span id (never all zero).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanId(pub [u8; 8]);

impl TraceId {
    /// A fresh random id.
    pub fn random() -> Self {
        let mut id = [0u8; 16];
        while id == [0; 16] {
            secure_random::fill(&mut id);
        }
        Self(id)
    }

    /// Lowercase hex, as in `traceparent` and OTLP/JSON.
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }

    /// The low 64 bits, for ratio sampling (the random part in W3C level 2).
    pub fn low_u64(self) -> u64 {
        let mut low = [0u8; 8];
        low.copy_from_slice(&self.0[8..]);
        u64::from_be_bytes(low)
    }
}

impl SpanId {
    /// A fresh random id.
    pub fn random() -> Self {
        let mut id = [0u8; 8];
        while id == [0; 8] {
            secure_random::fill(&mut id);
        }
        Self(id)
    }

    /// Lowercase hex, as in `traceparent` and OTLP/JSON.
    pub fn to_hex(self) -> String {
        hex(&self.0)
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Parse lowercase hex into `out`; `None` on any other character.
fn unhex(text: &[u8], out: &mut [u8]) -> Option<()> {
    if text.len() != out.len() * 2 {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    for (i, pair) in text.chunks_exact(2).enumerate() {
        *out.get_mut(i)? = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(())
}

/// A parsed `traceparent`: the caller's trace, its span and flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    /// The caller's span: the parent of ours.
    pub parent_id: SpanId,
    pub flags: u8,
}

impl TraceParent {
    /// Parse a `traceparent` value; `None` when it is malformed.
    pub fn parse(value: &HeaderValue) -> Option<Self> {
        let text = value.as_bytes();
        // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 bytes.
        if text.len() < 55 {
            return None;
        }
        let mut version = [0u8; 1];
        unhex(&text[..2], &mut version)?;
        // Version ff is invalid; version 00 is exactly 55 bytes; a later version may
        // append fields after a dash, which we ignore.
        match version[0] {
            0xff => return None,
            0x00 if text.len() != 55 => return None,
            _ if text.len() > 55 && text[55] != b'-' => return None,
            _ => {}
        }
        if text[2] != b'-' || text[35] != b'-' || text[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        unhex(&text[3..35], &mut trace_id)?;
        let mut parent_id = [0u8; 8];
        unhex(&text[36..52], &mut parent_id)?;
        let mut flags = [0u8; 1];
        unhex(&text[53..55], &mut flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            flags: flags[0],
        })
    }

    /// The client's `traceparent` in `headers`, when there is exactly one valid one.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let first = values.next()?;
        // Several traceparent headers are ambiguous: the recommendation says to ignore them.
        if values.next().is_some() {
            return None;
        }
        Self::parse(first)
    }

    /// Whether the caller recorded its span.
    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }
}

/// A `traceparent` (version 00) naming `span` of `trace` as the parent.
pub fn traceparent(trace: TraceId, span: SpanId, flags: u8) -> Option<HeaderValue> {
    let text = format!("00-{}-{}-{flags:02x}", trace.to_hex(), span.to_hex());
    HeaderValue::try_from(text).ok()
}

/// The client's `tracestate`, when it may be forwarded: one header, printable ASCII, at
/// most 512 bytes (a longer one is dropped rather than cut mid-entry).
pub fn tracestate(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(TRACESTATE).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let bytes = value.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_TRACESTATE_BYTES
        && bytes.iter().all(|b| (0x20..0x7f).contains(b));
    ok.then(|| value.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Option<TraceParent> {
        TraceParent::parse(&HeaderValue::from_str(s).unwrap())
    }

    #[test]
    fn valid_traceparents_parse_and_round_trip() {
        let tp = parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(tp.trace_id.to_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(tp.parent_id.to_hex(), "00f067aa0ba902b7");
        assert!(tp.sampled());
        let out = traceparent(tp.trace_id, tp.parent_id, tp.flags).unwrap();
        assert_eq!(
            out,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
        // A later version may carry more fields.
        assert!(parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-extra").is_some());
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        for bad in [
            "",
            "garbage",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-011",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert!(parse(bad).is_none(), "{bad} should be rejected");
        }
    }

    #[test]
    fn random_ids_are_not_zero() {
        assert_ne!(TraceId::random().0, [0; 16]);
        assert_ne!(SpanId::random().0, [0; 8]);
    }
}
