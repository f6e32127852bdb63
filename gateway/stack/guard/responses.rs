//! The guard of `/v1/responses` answers (I1): a response is a success only when SGLang
//! finished it (`status` `completed`, or `incomplete` at its token budget), with no error
//! inside the 200 and the prompt count kvgate expects.
//!
//! Shapes (sglang 0.5.23 `serving_responses.py`; the simulated engine's `responses*.rs`
//! follow them): a whole answer is the response object, `status` and `usage.input_tokens`;
//! a stream is `event: <type>` / `data: <json>` events ending in `response.completed`,
//! `response.incomplete` or `response.failed`, with no `[DONE]`. A `response.failed` or
//! `error` event, an end without a final event, or a final `usage.input_tokens` that
//! disagrees with kvgate's count: the client gets an `error` event instead, never the
//! final success event. A continuation of a stored response (`Continuation`) was counted
//! for its new part only: the engine's count must be at least that.

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::response::Parts;
use http::Response;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::{json, Value};

use super::inspect::{error_object, Expectation, Trip};
use super::report::TripReport;
use super::sse::{SseEvent, SseReframer};
use crate::body::{self, BoxBody, BoxError};
use crate::stack::rate_limit::UsageCell;

/// The check of one response object (a whole answer, or a stream's final event's).
pub(super) fn check_response(
    v: &Value,
    expect: &Expectation,
    continuation: bool,
) -> Result<(), Trip> {
    if let Some(trip) = error_object(v) {
        return Err(trip);
    }
    let message = || {
        v.get("error")
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("the engine did not finish the response")
            .to_owned()
    };
    match v.get("status").and_then(Value::as_str) {
        Some("completed" | "incomplete") => {}
        Some("failed" | "cancelled") => {
            return Err(Trip::Aborted {
                status: None,
                message: message(),
            })
        }
        _ => {
            return Err(Trip::EmptyResult {
                detail: "the response is not finished",
            })
        }
    }
    let reported = v
        .get("usage")
        .and_then(|u| u.get("input_tokens"))
        .and_then(Value::as_u64);
    if !continuation {
        return expect.check_prompt_tokens(None, reported);
    }
    // The stored conversation comes before the new part: at least kvgate's count.
    match (&expect.prompt_tokens, reported) {
        (Some(expected), Some(reported)) if reported < expected.iter().sum::<u64>() => {
            Err(Trip::PromptTokens {
                sample: 0,
                expected: expected.iter().sum(),
                reported,
            })
        }
        _ => Ok(()),
    }
}

/// The engine's usage of a response object (for rate-limit settlement).
pub(super) fn response_usage(v: &Value) -> Option<u64> {
    v.get("usage")?.get("total_tokens")?.as_u64()
}

/// What one guarded Responses stream still holds.
struct Guarded {
    body: BoxBody,
    reframer: SseReframer,
    expect: Expectation,
    continuation: bool,
    report: TripReport,
    usage: Option<UsageCell>,
    done: bool,
}

/// The guarded stream: events pass as they come; a failure becomes an `error` event that
/// ends it.
pub(super) fn guard_responses_stream(
    parts: Parts,
    body: BoxBody,
    expect: Expectation,
    continuation: bool,
    report: TripReport,
    usage: Option<UsageCell>,
) -> Response<BoxBody> {
    let state = Guarded {
        body,
        reframer: SseReframer::new(),
        expect,
        continuation,
        report,
        usage,
        done: false,
    };
    let events = stream::unfold(state, |mut state| async move {
        loop {
            if state.done {
                return None;
            }
            let mut events: Vec<SseEvent> = Vec::new();
            let out = match state.body.frame().await {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    match state.reframer.push(&data, &mut events) {
                        Ok(()) => pass(&mut state, &events),
                        Err(_) => trip(
                            &mut state,
                            Trip::Unparsable {
                                detail: "a stream event from the engine is too large",
                            },
                        ),
                    }
                }
                Some(Err(_)) => trip(
                    &mut state,
                    Trip::Truncated {
                        detail: "the engine's stream failed",
                    },
                ),
                None => {
                    let tail: Vec<SseEvent> = state.reframer.finish().into_iter().collect();
                    let mut out = pass(&mut state, &tail);
                    if !state.done {
                        out.extend(trip(
                            &mut state,
                            Trip::Truncated {
                                detail: "the stream ended without a final response event",
                            },
                        ));
                    }
                    out
                }
            };
            if !out.is_empty() {
                return Some((Ok::<_, BoxError>(Frame::data(Bytes::from(out))), state));
            }
        }
    });
    Response::from_parts(parts, body::boxed(StreamBody::new(events.boxed())))
}

/// Pass `events` on, checking the failures and the final event.
fn pass(state: &mut Guarded, events: &[SseEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        if state.done {
            break;
        }
        let Some(v) = event.json() else {
            out.extend_from_slice(&event.raw);
            continue;
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or_default()
            .to_owned();
        match kind.as_str() {
            "error" => {
                let message = v
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the engine reported an error")
                    .to_owned();
                out.extend(trip(
                    state,
                    Trip::ErrorIn2xx {
                        status: None,
                        message,
                    },
                ));
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                let response = v.get("response").cloned().unwrap_or(Value::Null);
                match check_response(&response, &state.expect, state.continuation) {
                    Ok(()) => {
                        if let (Some(cell), Some(total)) = (&state.usage, response_usage(&response))
                        {
                            cell.set(total);
                        }
                        out.extend_from_slice(&event.raw);
                        state.done = true;
                    }
                    Err(t) => out.extend(trip(state, t)),
                }
            }
            _ => {
                if let Some(t) = error_object(&v) {
                    out.extend(trip(state, t));
                } else {
                    out.extend_from_slice(&event.raw);
                }
            }
        }
    }
    out
}

/// Record `t` and end the stream with an `error` event in the Responses API's shape.
fn trip(state: &mut Guarded, t: Trip) -> Vec<u8> {
    state.done = true;
    let error = state.report.record(&t);
    let data = json!({
        "type": "error",
        "code": error.code(),
        "message": error.client_message(),
        "param": null,
    });
    format!("event: error\ndata: {data}\n\n").into_bytes()
}
