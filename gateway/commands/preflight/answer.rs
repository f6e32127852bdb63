//! What a probe saw: one engine answer, whole or streamed, read into the facts a verdict
//! needs (status, finish reason, reported prompt count, generated text, any refusal) and
//! the evidence a FAIL shows.
//!
//! The guard's own readers decide what an abort, an error object and a final finish reason
//! are, so preflight and the gateway cannot disagree about them.

use serde::Serialize;
use serde_json::Value;

use crate::stack::guard::inspect::{
    error_object, native_finish, openai_finish, Answer, Expectation, Markers, Shape, Trip,
};
use crate::stack::guard::sse::{SseEvent, SseReframer};

/// How many bytes of the answer a report quotes.
const FIRST_BYTES: usize = 240;

/// One engine answer, read.
#[derive(Debug, Clone, Serialize)]
pub struct Observed {
    /// The HTTP status (0 when no answer came: connection refused, timed out, cut).
    pub status: u16,
    /// The start of the body, lossily decoded, for the report.
    pub first_bytes: String,
    /// The engine's finish reason (native `finish_reason.type`, OpenAI `finish_reason`).
    pub finish_reason: Option<String>,
    /// The engine's `prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// The prompt tokens the engine says it found in its cache (native
    /// `meta_info.cached_tokens`, OpenAI `usage.prompt_tokens_details.cached_tokens`) in a
    /// whole answer; None when it does not say.
    pub cached_tokens: Option<u64>,
    /// Why the engine refused (error status, error object, abort), when it did.
    pub refusal: Option<String>,
    /// Whether it looks like a success: 2xx, no refusal, a final finish reason and, for a
    /// stream, `[DONE]` or a final event.
    pub success_like: bool,
    /// All generated text (streams: every chunk's), for the isolation scan.
    #[serde(skip)]
    pub text: String,
    /// The guard's verdict on it as a success (None when it passes).
    pub guard_trip: Option<String>,
}

impl Observed {
    /// No answer at all (the request failed before a status line or while reading).
    pub fn unanswered(detail: String) -> Self {
        Self {
            status: 0,
            first_bytes: String::new(),
            finish_reason: None,
            prompt_tokens: None,
            cached_tokens: None,
            refusal: Some(detail),
            success_like: false,
            text: String::new(),
            guard_trip: None,
        }
    }

    /// Read a whole answer (`stream` says whether an SSE stream was asked for).
    pub fn read(
        status: u16,
        body: &[u8],
        stream: bool,
        shape: Shape,
        markers: &Markers,
        expect: &Expectation,
    ) -> Self {
        let mut seen = Seen::default();
        let looks_like_sse = {
            let t = body.trim_ascii_start();
            t.starts_with(b"data:") || t.starts_with(b":") || t.starts_with(b"event:")
        };
        let guard = if stream && looks_like_sse {
            read_stream(body, shape, markers, expect, &mut seen)
        } else {
            let answer = Answer::parse(body, shape);
            let guard = answer.check(shape, markers, expect);
            read_whole(body, shape, &mut seen);
            seen.text = answer.texts(shape).concat();
            guard
        };
        let two_xx = (200..300).contains(&status);
        if !two_xx {
            seen.refusal = Some(match seen.refusal_message.take() {
                Some(message) => format!("HTTP {status}: {message}"),
                None => format!("HTTP {status}"),
            });
        }
        let success_like = two_xx && seen.refusal.is_none() && seen.final_finish;
        Self {
            status,
            first_bytes: first_bytes(body),
            finish_reason: seen.finish_reason,
            prompt_tokens: seen.prompt_tokens,
            cached_tokens: (!stream).then(|| cached_tokens(body)).flatten(),
            refusal: seen.refusal,
            success_like,
            text: seen.text,
            guard_trip: if two_xx {
                guard.err().map(|t| describe(&t))
            } else {
                None
            },
        }
    }
}

/// The cached prompt tokens a whole answer reports, in either shape.
fn cached_tokens(body: &[u8]) -> Option<u64> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let one = v.as_array().and_then(|a| a.first()).unwrap_or(&v);
    one.pointer("/meta_info/cached_tokens")
        .or_else(|| one.pointer("/usage/prompt_tokens_details/cached_tokens"))
        .and_then(Value::as_u64)
}

/// What the readers gather.
#[derive(Default)]
struct Seen {
    finish_reason: Option<String>,
    final_finish: bool,
    prompt_tokens: Option<u64>,
    refusal: Option<String>,
    /// The engine's own words for the refusal (for a non-2xx status line).
    refusal_message: Option<String>,
    text: String,
}

impl Seen {
    fn refuse(&mut self, trip: &Trip) {
        if self.refusal.is_none() {
            self.refusal = Some(describe(trip));
            if let Trip::Aborted { message, .. } | Trip::ErrorIn2xx { message, .. } = trip {
                self.refusal_message = Some(message.clone());
            }
        }
    }

    /// One answer object, or one stream event: its error, finish and prompt count.
    fn item(&mut self, v: &Value, shape: Shape) {
        if let Some(trip) = error_object(v) {
            self.refuse(&trip);
        }
        match shape {
            Shape::Native => {
                let Some(meta) = v.get("meta_info") else {
                    return;
                };
                if let Some(n) = meta.get("prompt_tokens").and_then(Value::as_u64) {
                    self.prompt_tokens = Some(n);
                }
                let finish = meta.get("finish_reason").unwrap_or(&Value::Null);
                if let Some(kind) = finish.get("type").and_then(Value::as_str) {
                    self.finish_reason = Some(kind.to_owned());
                }
                match native_finish(finish) {
                    Ok(done) => self.final_finish |= done,
                    Err(trip) => self.refuse(&trip),
                }
            }
            Shape::OpenAi => {
                if let Some(n) = v
                    .get("usage")
                    .and_then(|u| u.get("prompt_tokens"))
                    .and_then(Value::as_u64)
                {
                    self.prompt_tokens = Some(n);
                }
                for choice in v
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                        self.finish_reason = Some(reason.to_owned());
                    }
                    match openai_finish(choice) {
                        Ok(done) => self.final_finish |= done,
                        Err(trip) => self.refuse(&trip),
                    }
                }
            }
        }
    }
}

fn read_whole(body: &[u8], shape: Shape, seen: &mut Seen) {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Array(items)) => items.iter().for_each(|i| seen.item(i, shape)),
        Ok(v) => seen.item(&v, shape),
        Err(_) => {}
    }
}

/// A stream: every event read; the guard's checks applied as the gateway applies them to a
/// stream (errors, aborts, a final finish reason and `[DONE]`, the prompt count, markers).
fn read_stream(
    body: &[u8],
    shape: Shape,
    markers: &Markers,
    expect: &Expectation,
    seen: &mut Seen,
) -> Result<(), Trip> {
    let mut events: Vec<SseEvent> = Vec::new();
    let mut reframer = SseReframer::new();
    if reframer.push(body, &mut events).is_err() {
        seen.refusal = Some("the stream is not valid SSE".into());
    }
    events.extend(reframer.finish());
    let mut done = false;
    let mut native_text = String::new();
    for event in &events {
        if event.is_done() {
            done = true;
            continue;
        }
        let Some(v) = event.json() else {
            continue;
        };
        seen.item(&v, shape);
        match shape {
            // SGLang's native stream sends the text so far in every event.
            Shape::Native => {
                if let Some(t) = v.get("text").and_then(Value::as_str) {
                    native_text = t.to_owned();
                }
            }
            Shape::OpenAi => {
                for choice in v
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let piece = choice
                        .get("delta")
                        .and_then(|d| d.get("content"))
                        .or_else(|| choice.get("text"))
                        .and_then(Value::as_str);
                    seen.text.push_str(piece.unwrap_or_default());
                }
            }
        }
    }
    if shape == Shape::Native {
        seen.text = native_text;
    }
    if let Some(trip) = seen.refusal.as_ref().map(|r| Trip::ErrorIn2xx {
        status: None,
        message: r.clone(),
    }) {
        return Err(trip);
    }
    if !seen.final_finish || !done {
        // Ends like a success only with both: a final finish reason and `[DONE]`.
        seen.final_finish = false;
        return Err(Trip::Truncated {
            detail: "the stream ended without a final finish_reason and [DONE]",
        });
    }
    expect.check_prompt_tokens(None, seen.prompt_tokens)?;
    if markers.matches(&seen.text) {
        return Err(Trip::PlaceholderMarker);
    }
    Ok(())
}

fn describe(trip: &Trip) -> String {
    let (what, status, message) = match trip {
        Trip::Aborted { status, message } => ("aborted by the engine", status, message),
        Trip::ErrorIn2xx { status, message } => ("an error inside a 2xx answer", status, message),
        Trip::PromptTokens {
            expected, reported, ..
        } => return format!("prompt_tokens {reported}, expected {expected}"),
        other => return other.reason().to_owned(),
    };
    match status {
        Some(s) => format!("{what} (status {s}): {message}"),
        None => format!("{what}: {message}"),
    }
}

fn first_bytes(body: &[u8]) -> String {
    let end = body.len().min(FIRST_BYTES);
    let mut s = String::from_utf8_lossy(&body[..end]).into_owned();
    if body.len() > end {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GuardConfig;
    use std::sync::Arc;

    fn expect(n: u64) -> Expectation {
        Expectation {
            prompt_tokens: Some(Arc::from(vec![n])),
            tolerance: 0,
        }
    }

    fn markers() -> Markers {
        Markers::from_config(&GuardConfig::default())
    }

    fn read(status: u16, body: &str, stream: bool, shape: Shape) -> Observed {
        Observed::read(
            status,
            body.as_bytes(),
            stream,
            shape,
            &markers(),
            &expect(10),
        )
    }

    #[test]
    fn a_native_success_with_the_right_count_passes() {
        let o = read(
            200,
            r#"{"text":"hi","meta_info":{"prompt_tokens":10,"finish_reason":{"type":"length","length":4}}}"#,
            false,
            Shape::Native,
        );
        assert!(o.success_like);
        assert_eq!(o.guard_trip, None);
        assert_eq!(o.prompt_tokens, Some(10));
        assert_eq!(o.finish_reason.as_deref(), Some("length"));
        assert_eq!(o.text, "hi");
    }

    #[test]
    fn the_incidents_placeholder_looks_like_a_success_with_a_wrong_count() {
        let o = read(
            200,
            r#"{"text":"stale","meta_info":{"prompt_tokens":1,"finish_reason":{"type":"length","length":4}}}"#,
            false,
            Shape::Native,
        );
        assert!(o.success_like, "a 200 with a final finish is success-like");
        assert_eq!(
            o.guard_trip.as_deref(),
            Some("prompt_tokens 1, expected 10")
        );
    }

    #[test]
    fn an_abort_inside_a_200_is_a_refusal() {
        let o = read(
            200,
            r#"{"text":"","meta_info":{"prompt_tokens":10,"finish_reason":{"type":"abort","message":"too long","status_code":400}}}"#,
            false,
            Shape::Native,
        );
        assert!(!o.success_like);
        assert!(o.refusal.as_deref().is_some_and(|r| r.contains("too long")));
    }

    #[test]
    fn an_error_status_is_a_refusal() {
        let o = read(
            400,
            r#"{"object":"error","message":"too long"}"#,
            false,
            Shape::OpenAi,
        );
        assert!(!o.success_like);
        assert!(o.refusal.is_some());
        assert_eq!(o.guard_trip, None);
    }

    #[test]
    fn a_stream_needs_a_final_finish_and_done() {
        let ok = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n\
                  data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":10}}\n\n\
                  data: [DONE]\n\n";
        let o = read(200, ok, true, Shape::OpenAi);
        assert!(o.success_like, "{o:?}");
        assert_eq!(o.guard_trip, None);
        assert_eq!(o.text, "ab");

        let cut =
            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n";
        let o = read(200, cut, true, Shape::OpenAi);
        assert!(!o.success_like);
        assert!(o.guard_trip.is_some());

        let aborted = "data: {\"text\":\"x\",\"meta_info\":{\"prompt_tokens\":10,\"finish_reason\":{\"type\":\"abort\",\"message\":\"no\"}}}\n\ndata: [DONE]\n\n";
        let o = read(200, aborted, true, Shape::Native);
        assert!(!o.success_like);
        assert!(o.refusal.is_some());
    }

    #[test]
    fn native_stream_text_is_the_last_cumulative_text() {
        let s = "data: {\"text\":\"a\",\"meta_info\":{\"prompt_tokens\":10,\"finish_reason\":null}}\n\n\
                 data: {\"text\":\"ab\",\"meta_info\":{\"prompt_tokens\":10,\"finish_reason\":{\"type\":\"length\",\"length\":2}}}\n\n\
                 data: [DONE]\n\n";
        let o = read(200, s, true, Shape::Native);
        assert!(o.success_like);
        assert_eq!(o.text, "ab");
    }
}
