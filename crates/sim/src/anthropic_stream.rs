//! The streamed form of a `/v1/messages` answer, as SGLang's `_generate_anthropic_stream`
//! (`python/sglang/srt/entrypoints/anthropic/serving.py`, sgl-project/sglang commit
//! bef8e23885ea40a1c246143e5a699b484ef04c64) turns the chat's chunks into Anthropic events,
//! each sent as `event: <type>\ndata: <json>\n\n` (no `ping`):
//!
//! - `message_start` once, at the first chunk with a payload; its usage is that chunk's
//!   (SGLang's continuous usage stats carry no cached tokens, so `input_tokens` is the
//!   whole prompt and there is no `cache_read_input_tokens`), `output_tokens` 0;
//! - a `content_block_start` / `content_block_delta`s / `content_block_stop` run per block:
//!   thinking (`thinking_delta`), text (`text_delta`), each tool call (`input_json_delta`;
//!   its start block carries `input: {}`); a block closes when another type opens;
//! - at `[DONE]`: the open block closed, `message_delta` with the stop reason and the final
//!   usage chunk's `{"output_tokens": n}`, then `message_stop`.
//!
//! An error (`_flush_on_error`): `message_start` if not sent yet (usage 0/0), the open block
//! closed, `error` with the type `ERROR_TYPE_MAP` gives the chat error's code, and
//! `message_stop`, with no `message_delta`. A refused prompt (and an abort with a status)
//! fails before any token; `--fault error-event` after the deltas (code 500: `api_error`).

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{Answer, Delta};
use super::reply::Event;
use super::request::random_hex;
use super::schedule::{Finish, SampleResult};

/// `ERROR_TYPE_MAP`: an HTTP status → Anthropic's error type.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "request_timeout_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    }
}

/// `STOP_REASON_MAP` with its `end_turn` default.
pub(crate) fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ => "end_turn",
    }
}

/// `msg_` and 32 hex digits (`uuid.uuid4().hex`).
pub(crate) fn message_id() -> String {
    format!("msg_{}", random_hex())
}

/// `event: <type>\ndata: <json>\n\n`.
fn event(token: bool, value: &Value) -> Event {
    let kind = value
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Event {
        token,
        data: Bytes::from(format!("event: {kind}\ndata: {value}\n\n")),
    }
}

/// The events of one answer, with the open content block tracked.
struct Events {
    out: Vec<Event>,
    /// The open block's type, if any.
    open: Option<&'static str>,
    index: usize,
    /// The next event follows a newly generated token.
    token: bool,
}

impl Events {
    fn push(&mut self, value: &Value) {
        let token = std::mem::take(&mut self.token);
        self.out.push(event(token, value));
    }

    fn close(&mut self) {
        if self.open.take().is_some() {
            let index = self.index;
            self.push(&json!({"type": "content_block_stop", "index": index}));
            self.index += 1;
        }
    }

    /// Opens a block of `kind` unless one is open already (`force`: always a new one).
    fn ensure(&mut self, kind: &'static str, block: Value, force: bool) {
        if self.open.is_some() && (force || self.open != Some(kind)) {
            self.close();
        }
        if self.open.is_none() {
            let index = self.index;
            self.push(
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            );
            self.open = Some(kind);
        }
    }

    fn delta(&mut self, delta: Value) {
        let index = self.index;
        self.push(&json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    /// `_flush_on_error` after `message_start`.
    fn fail(mut self, status: u16, message: &str) -> Vec<Event> {
        self.close();
        self.push(
            &json!({"type": "error", "error": {"type": error_type(status), "message": message}}),
        );
        self.push(&json!({"type": "message_stop"}));
        self.out
    }
}

fn message_start(model: &str, input_tokens: usize) -> Value {
    json!({"type": "message_start", "message": {
        "id": message_id(), "type": "message", "role": "assistant", "content": [],
        "model": model, "usage": {"input_tokens": input_tokens, "output_tokens": 0},
    }})
}

/// The SSE events of a streamed `/v1/messages` answer.
pub(crate) fn events(model: &str, result: &SampleResult, answer: &Answer) -> Vec<Event> {
    let mut events = Events {
        out: Vec::new(),
        open: None,
        index: 0,
        token: false,
    };
    // Refused or aborted with a status: the chat's stream fails before its first chunk.
    let early = match &result.finish {
        Finish::Rejected { message, status } => Some((message, *status)),
        Finish::Abort(info) => info.status_code.map(|s| (&info.message, s)),
        _ => None,
    };
    if let Some((message, status)) = early {
        events.push(&message_start(model, 0));
        return events.fail(status, message);
    }
    // The role chunk already carries the continuous usage: the message starts with it.
    events.push(&message_start(model, result.prompt_tokens));
    for piece in &answer.pieces {
        events.token |= piece.token;
        match &piece.delta {
            Delta::Reasoning(text) if !text.is_empty() => {
                events.ensure(
                    "thinking",
                    json!({"type": "thinking", "thinking": ""}),
                    false,
                );
                events.delta(json!({"type": "thinking_delta", "thinking": text}));
            }
            Delta::Content(text) if !text.is_empty() => {
                events.ensure("text", json!({"type": "text", "text": ""}), false);
                events.delta(json!({"type": "text_delta", "text": text}));
            }
            Delta::ToolHead => {
                if let Some(call) = &answer.tool_call {
                    let block =
                        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
                    events.ensure("tool_use", block, true);
                }
            }
            Delta::ToolArgs(fragment)
                if !fragment.is_empty() && events.open == Some("tool_use") =>
            {
                events.delta(json!({"type": "input_json_delta", "partial_json": fragment}));
            }
            _ => {}
        }
    }
    if let Finish::Error { message } = &result.finish {
        // The chat's `data: {"error": ...}` (code 500) after the deltas.
        return events.fail(500, message);
    }
    events.close();
    let delta = json!({"stop_reason": stop_reason(answer.finish)});
    events.push(&json!({
        "type": "message_delta", "delta": delta, "usage": {"output_tokens": answer.ids.len()},
    }));
    events.push(&json!({"type": "message_stop"}));
    events.out
}
