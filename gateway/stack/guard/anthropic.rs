//! The guard of Anthropic answers an engine wrote itself ([`Endpoint::EngineMessages`]:
//! a model with `anthropic_messages = "engine"`), I1: a message is a success only when it
//! is a finished message with the prompt count kvgate expects, with no error inside the 200.
//!
//! Shapes (SGLang `entrypoints/anthropic/serving.py` and `response_conversion.py`, read at
//! sgl-project/sglang bef8e238 and 2d668498; unverified against a running SGLang): a whole
//! answer is `{"type": "message", "content": [...], "stop_reason", "usage":
//! {"input_tokens", "output_tokens", "cache_read_input_tokens"?}}`, where `input_tokens` is
//! the prompt less its cached part, so the prompt is `input_tokens +
//! cache_read_input_tokens`. A stream is `event: <type>` / `data: <json>` events:
//! `message_start` (with that usage), content blocks, `message_delta` (the stop reason and
//! `output_tokens`), `message_stop`; an engine failure is an `error` event, which SGLang
//! follows with `message_stop`. An `error` event, a `message_start` whose prompt count
//! disagrees, a `message_stop` without a stop reason before it, or an end without
//! `message_stop`: the client gets an Anthropic `error` event instead, never the
//! `message_stop` that tells its SDK the message is whole.
//!
//! What this cannot see: SGLang maps a generation aborted without a status (OpenAI
//! `finish_reason: "abort"`) to `stop_reason: "end_turn"` (`OPENAI_TO_ANTHROPIC_STOP_REASON`
//! and its fallback), in both shapes. Such an answer passes here; the translating mode
//! (`anthropic_messages = "translate"`, the default) sees the chat's abort and refuses it.
//!
//! [`Endpoint::EngineMessages`]: crate::stack::api::Endpoint::EngineMessages

use http::response::Parts;
use http::Response;
use serde_json::{json, Value};

use super::event_stream::{failure_trip, HeldEvents};
use super::inspect::{Expectation, Trip};
use super::leak::LeakScan;
use super::report::TripReport;
use super::sse::{rewrite_stream, Rewrite, SseEvent, StreamFailure};
use super::stream_end::StreamEnd;
use crate::accounting::TokenUsage;
use crate::anthropic::error_type;
use crate::body::BoxBody;
use crate::stack::rate_limit::UsageCell;

/// Anthropic's stop reasons (Messages API reference): a message with another one, or none,
/// is not finished.
const STOP_REASONS: [&str; 6] = [
    "end_turn",
    "max_tokens",
    "stop_sequence",
    "tool_use",
    "pause_turn",
    "refusal",
];

/// The prompt an Anthropic `usage` object accounts for: the uncached input and what was
/// read from (or written to) the prompt cache.
fn prompt_tokens(usage: &Value) -> Option<u64> {
    let input = usage.get("input_tokens")?.as_u64()?;
    let cached = ["cache_read_input_tokens", "cache_creation_input_tokens"]
        .iter()
        .filter_map(|k| usage.get(*k).and_then(Value::as_u64))
        .fold(0u64, u64::saturating_add);
    Some(input.saturating_add(cached))
}

/// An Anthropic error inside a 200 (`{"type": "error", "error": {...}}`).
fn error_in(v: &Value) -> Option<Trip> {
    if v.get("type").and_then(Value::as_str) != Some("error") {
        return None;
    }
    let message = v
        .get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the engine reported an error")
        .to_owned();
    Some(Trip::ErrorIn2xx {
        status: None,
        message,
    })
}

/// The check of a whole message.
pub(super) fn check_message(v: &Value, expect: &Expectation) -> Result<(), Trip> {
    if let Some(trip) = error_in(v) {
        return Err(trip);
    }
    if v.get("type").and_then(Value::as_str) != Some("message")
        || !v.get("content").is_some_and(Value::is_array)
    {
        return Err(Trip::Unparsable {
            detail: "the engine's answer is not an Anthropic message",
        });
    }
    let stop = v.get("stop_reason").and_then(Value::as_str);
    if !stop.is_some_and(|s| STOP_REASONS.contains(&s)) {
        return Err(Trip::EmptyResult {
            detail: "the message has no stop reason",
        });
    }
    let Some(prompt) = v.get("usage").and_then(prompt_tokens) else {
        return Err(Trip::EmptyResult {
            detail: "the message has no usage.input_tokens",
        });
    };
    expect.check_prompt_tokens(None, Some(prompt))
}

/// The generated texts of a message (its text and thinking blocks), for the leak scan.
pub(super) fn message_texts(v: &Value) -> Vec<&str> {
    v.get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|block| {
            block
                .get("text")
                .or_else(|| block.get("thinking"))
                .and_then(Value::as_str)
        })
        .collect()
}

/// The tokens a message used (prompt and output), for rate-limit settlement.
pub(super) fn message_usage(v: &Value) -> Option<u64> {
    let usage = v.get("usage")?;
    Some(prompt_tokens(usage)?.saturating_add(usage.get("output_tokens")?.as_u64()?))
}

/// What one guarded Anthropic stream holds.
struct Guarded {
    expect: Option<Expectation>,
    leak: Option<LeakScan>,
    /// Its outcome and token times, counted when the client's body goes.
    end: StreamEnd,
    usage: Option<UsageCell>,
    /// The prompt `message_start` reported; the stop reason and output of `message_delta`.
    prompt: Option<u64>,
    /// Of the prompt, what `message_start` said was read from the cache.
    cached: u64,
    stop_reason: Option<String>,
    output: Option<u64>,
    /// Events held back while the leak scan is inside a foreign run.
    held: HeldEvents,
    done: bool,
}

/// The guarded stream: events pass as they come; a failure becomes an `error` event that
/// ends it. `expect` is `None` when the pool's checks are off (the leak scan still runs).
pub(super) fn guard_messages_stream(
    parts: Parts,
    body: BoxBody,
    expect: Option<Expectation>,
    leak: Option<LeakScan>,
    report: TripReport,
    usage: Option<UsageCell>,
) -> Response<BoxBody> {
    let guarded = Guarded {
        expect,
        leak,
        end: StreamEnd::new(report),
        usage,
        prompt: None,
        cached: 0,
        stop_reason: None,
        output: None,
        held: HeldEvents::default(),
        done: false,
    };
    Response::from_parts(parts, rewrite_stream(body, guarded))
}

impl Rewrite for Guarded {
    fn events(&mut self, events: &[SseEvent]) -> Vec<u8> {
        let mut out = Vec::new();
        for event in events {
            if self.done {
                break;
            }
            match self.check(event) {
                Ok(Step::Pass) => self.held.emit(self.leak.as_ref(), &mut out, &event.raw),
                Ok(Step::Finish) => {
                    self.held.release(&mut out);
                    out.extend_from_slice(&event.raw);
                    self.done = true;
                    self.end.completed();
                }
                Err(t) => out.extend(self.trip(t)),
            }
        }
        out
    }

    fn failed(&mut self, why: StreamFailure) -> Vec<u8> {
        self.trip(failure_trip(why))
    }

    fn ended(&mut self) -> Vec<u8> {
        self.trip(Trip::Truncated {
            detail: "the stream ended without message_stop",
        })
    }

    fn done(&self) -> bool {
        self.done
    }
}

/// What to do with an event that passed its check.
enum Step {
    Pass,
    /// `message_stop` of a finished message: pass it and end.
    Finish,
}

impl Guarded {
    fn check(&mut self, event: &SseEvent) -> Result<Step, Trip> {
        if event.comment_only || (event.data.is_none() && event.complete) {
            // A keep-alive comment (a proxy in between) or an event without data.
            return Ok(Step::Pass);
        }
        let Some(v) = event.json() else {
            return Err(Trip::Unparsable {
                detail: "a stream event from the engine is not JSON",
            });
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(event.event.as_deref())
            .unwrap_or_default();
        match kind {
            "error" => Err(
                error_in(&json!({"type": "error", "error": v.get("error")})).unwrap_or(
                    Trip::ErrorIn2xx {
                        status: None,
                        message: "the engine reported an error".into(),
                    },
                ),
            ),
            "message_start" => {
                let usage = v
                    .get("message")
                    .and_then(|m| m.get("usage"))
                    .unwrap_or(&Value::Null);
                self.prompt = prompt_tokens(usage);
                self.cached = usage
                    .get("cache_read_input_tokens")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                match &self.expect {
                    Some(expect) => expect.check_prompt_tokens(None, self.prompt),
                    None => Ok(()),
                }
                .map(|()| Step::Pass)
            }
            "content_block_delta" => {
                self.end.token();
                let delta = v.get("delta").unwrap_or(&Value::Null);
                let text = delta
                    .get("text")
                    .or_else(|| delta.get("thinking"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match self.leak.as_mut() {
                    Some(leak) if !text.is_empty() => leak.push(text, false).map(|()| Step::Pass),
                    _ => Ok(Step::Pass),
                }
            }
            "message_delta" => {
                self.stop_reason = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                self.output = v
                    .get("usage")
                    .and_then(|u| u.get("output_tokens"))
                    .and_then(Value::as_u64);
                Ok(Step::Pass)
            }
            "message_stop" => self.finish().map(|()| Step::Finish),
            _ => Ok(Step::Pass),
        }
    }

    /// The checks at `message_stop`: a stop reason came, the leak scan's end; the usage is
    /// settled.
    fn finish(&mut self) -> Result<(), Trip> {
        let finished = self
            .stop_reason
            .as_deref()
            .is_some_and(|s| STOP_REASONS.contains(&s));
        if self.expect.is_some() && !finished {
            return Err(Trip::Truncated {
                detail: "the message stopped without a stop reason",
            });
        }
        if self.expect.is_some() && self.prompt.is_none() {
            return Err(Trip::EmptyResult {
                detail: "the message's prompt count never came (no message_start usage)",
            });
        }
        if let Some(leak) = self.leak.as_mut() {
            leak.push("", true)?;
        }
        if let (Some(cell), Some(prompt), Some(output)) = (&self.usage, self.prompt, self.output) {
            cell.set(prompt.saturating_add(output));
        }
        if let (Some(prompt), Some(completion)) = (self.prompt, self.output) {
            self.end.report().usage(TokenUsage {
                prompt,
                completion,
                cached: self.cached,
            });
        }
        Ok(())
    }

    /// Record `t` and end the stream with Anthropic's `error` event (what was held back is
    /// dropped).
    fn trip(&mut self, t: Trip) -> Vec<u8> {
        self.held.drop_all();
        self.done = true;
        self.end.tripped();
        let error = self.end.report().record(&t);
        let data = json!({
            "type": "error",
            "error": {"type": error_type(error.status()), "message": error.client_message()},
        });
        format!("event: error\ndata: {data}\n\n").into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expect(n: u64) -> Expectation {
        Expectation {
            prompt_tokens: Some(vec![n].into()),
            tolerance: 0,
        }
    }

    fn message(stop: Value, usage: Value) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
               "content": [{"type": "text", "text": "hi"}], "stop_reason": stop, "usage": usage})
    }

    #[test]
    fn a_finished_message_passes_when_its_prompt_with_the_cached_part_is_kvgates_count() {
        let usage = json!({"input_tokens": 4, "cache_read_input_tokens": 16, "output_tokens": 2});
        assert!(check_message(&message(json!("end_turn"), usage.clone()), &expect(20)).is_ok());
        assert!(matches!(
            check_message(&message(json!("end_turn"), usage.clone()), &expect(4)),
            Err(Trip::PromptTokens {
                expected: 4,
                reported: 20,
                ..
            })
        ));
        assert_eq!(message_usage(&message(json!("end_turn"), usage)), Some(22));
    }

    #[test]
    fn errors_unfinished_and_foreign_shapes_are_not_messages() {
        let usage = json!({"input_tokens": 5, "output_tokens": 1});
        let error = json!({"type": "error", "error": {"type": "api_error", "message": "boom"}});
        assert!(matches!(
            check_message(&error, &expect(5)),
            Err(Trip::ErrorIn2xx { .. })
        ));
        for stop in [Value::Null, json!("abort"), json!(7)] {
            assert!(
                check_message(&message(stop.clone(), usage.clone()), &expect(5)).is_err(),
                "{stop}"
            );
        }
        let no_usage = json!({"type": "message", "content": [], "stop_reason": "end_turn"});
        assert!(matches!(
            check_message(&no_usage, &expect(5)),
            Err(Trip::EmptyResult { .. })
        ));
        let chat = json!({"object": "chat.completion", "choices": []});
        assert!(matches!(
            check_message(&chat, &expect(5)),
            Err(Trip::Unparsable { .. })
        ));
    }

    #[test]
    fn the_leak_scan_reads_text_and_thinking_blocks() {
        let v = json!({"content": [{"type": "thinking", "thinking": "hmm"},
                                   {"type": "text", "text": "yes"},
                                   {"type": "tool_use", "id": "t", "name": "f", "input": {}}]});
        assert_eq!(message_texts(&v), vec!["hmm", "yes"]);
    }
}
