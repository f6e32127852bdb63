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

use http::response::Parts;
use http::Response;
use serde_json::{json, Value};

use super::event_stream::{failure_trip, HeldEvents};
use super::inspect::{error_object, Expectation, Trip};
use super::leak::LeakScan;
use super::report::TripReport;
use super::sse::{rewrite_stream, Rewrite, SseEvent, StreamFailure};
use super::stream_end::StreamEnd;
use crate::accounting::TokenUsage;
use crate::body::BoxBody;
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

/// The generated texts of a response object (its `output` items' `output_text` parts), for
/// the leak scan.
pub(super) fn output_texts(v: &Value) -> Vec<&str> {
    v.get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| item.get("content").and_then(Value::as_array))
        .flatten()
        .filter_map(|part| part.get("text").and_then(Value::as_str))
        .collect()
}

/// The engine's usage of a response object (for rate-limit settlement).
pub(super) fn response_usage(v: &Value) -> Option<u64> {
    v.get("usage")?.get("total_tokens")?.as_u64()
}

/// What a Responses stream is checked against.
pub(super) struct StreamChecks {
    pub(super) expect: Expectation,
    /// A continuation of a stored response ([`check_response`]).
    pub(super) continuation: bool,
    /// The pool's checks are on (off: the final event is read for its usage only).
    pub(super) enabled: bool,
    /// The leak scan of the generated text (block mode holds events while the text runs
    /// through another tenant's prompt).
    pub(super) leak: Option<LeakScan>,
}

/// What one guarded Responses stream still holds.
struct Guarded {
    checks: StreamChecks,
    /// Its outcome and token times, counted when the client's body goes.
    end: StreamEnd,
    usage: Option<UsageCell>,
    /// Events held back while the leak scan is inside a foreign run.
    held: HeldEvents,
    done: bool,
}

/// The guarded stream: events pass as they come; a failure becomes an `error` event that
/// ends it.
pub(super) fn guard_responses_stream(
    parts: Parts,
    body: BoxBody,
    checks: StreamChecks,
    report: TripReport,
    usage: Option<UsageCell>,
) -> Response<BoxBody> {
    let guarded = Guarded {
        checks,
        end: StreamEnd::new(report),
        usage,
        held: HeldEvents::default(),
        done: false,
    };
    Response::from_parts(parts, rewrite_stream(body, guarded))
}

impl Rewrite for Guarded {
    fn events(&mut self, events: &[SseEvent]) -> Vec<u8> {
        pass(self, events)
    }

    fn failed(&mut self, why: StreamFailure) -> Vec<u8> {
        trip(self, failure_trip(why))
    }

    fn ended(&mut self) -> Vec<u8> {
        trip(
            self,
            Trip::Truncated {
                detail: "the stream ended without a final response event",
            },
        )
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// Pass `events` on, checking the failures, the generated text and the final event.
fn pass(state: &mut Guarded, events: &[SseEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        if state.done {
            break;
        }
        let Some(v) = event.json() else {
            emit(state, &mut out, &event.raw);
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
                let checks = &mut state.checks;
                let checked = if checks.enabled {
                    check_response(&response, &checks.expect, checks.continuation)
                } else {
                    Ok(())
                };
                let checked = checked.and_then(|()| match checks.leak.as_mut() {
                    Some(leak) => leak.push("", true),
                    None => Ok(()),
                });
                match checked {
                    Ok(()) => {
                        if let (Some(cell), Some(total)) = (&state.usage, response_usage(&response))
                        {
                            cell.set(total);
                        }
                        if let Some(used) = response.get("usage").and_then(TokenUsage::from_usage) {
                            state.end.report().usage(used);
                        }
                        state.held.release(&mut out);
                        out.extend_from_slice(&event.raw);
                        state.done = true;
                        state.end.completed();
                    }
                    Err(t) => out.extend(trip(state, t)),
                }
            }
            kind if kind.ends_with(".delta") && kind != "response.output_text.delta" => {
                // Reasoning text and tool-call arguments: generated tokens too.
                state.end.token();
                match error_object(&v) {
                    Some(t) => out.extend(trip(state, t)),
                    None => emit(state, &mut out, &event.raw),
                }
            }
            "response.output_text.delta" => {
                state.end.token();
                let delta = v.get("delta").and_then(Value::as_str).unwrap_or_default();
                let scanned = match state.checks.leak.as_mut() {
                    Some(leak) => leak.push(delta, false),
                    None => Ok(()),
                };
                match scanned {
                    Ok(()) => emit(state, &mut out, &event.raw),
                    Err(t) => out.extend(trip(state, t)),
                }
            }
            _ => match error_object(&v) {
                Some(t) => out.extend(trip(state, t)),
                None => emit(state, &mut out, &event.raw),
            },
        }
    }
    out
}

/// Pass `raw` on, or hold it while a blocking leak scan is inside another tenant's text.
fn emit(state: &mut Guarded, out: &mut Vec<u8>, raw: &[u8]) {
    state.held.emit(state.checks.leak.as_ref(), out, raw);
}

/// Record `t` and end the stream with an `error` event in the Responses API's shape (what
/// was held back is dropped).
fn trip(state: &mut Guarded, t: Trip) -> Vec<u8> {
    state.held.drop_all();
    state.done = true;
    state.end.tripped();
    let error = state.end.report().record(&t);
    let data = json!({
        "type": "error",
        "code": error.code(),
        "message": error.client_message(),
        "param": null,
    });
    format!("event: error\ndata: {data}\n\n").into_bytes()
}
