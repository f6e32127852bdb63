//! OpenAI `chat.completion.chunk`s → Anthropic's streamed events.
//!
//! Anthropic's stream is `message_start`, then for each content block
//! `content_block_start`, `content_block_delta`s and `content_block_stop` (blocks indexed
//! from 0 in order), then `message_delta` (stop reason, usage) and `message_stop`. The block
//! state machine follows vLLM `vllm/entrypoints/anthropic/serving.py`
//! `message_stream_converter`: a thinking, text or tool_use block stays open while deltas
//! of its kind arrive and is closed when another kind (or another tool call) begins.
//! Where the gateway differs:
//! - `message_start` is sent at the first chunk and that chunk's content is translated too
//!   (vLLM discards the first chunk's content, which is empty on vLLM but need not be).
//!   Its `usage.input_tokens` is the first chunk's `usage.prompt_tokens` when the engine
//!   sends one (vLLM asks `continuous_usage_stats` for that), else the count given to
//!   [`StreamTranslator::with_input_tokens`]: the gateway's admission counted the prompt
//!   exactly before dispatch, so it needs no per-chunk usage from the engine. The final
//!   `message_delta` repeats `input_tokens` from the engine's closing usage, which the
//!   Anthropic SDK takes over the start value.
//! - `message_delta` is sent at [`StreamTranslator::finish`] (the `[DONE]` sentinel), not at
//!   the usage chunk, so it works whether usage comes in its own chunk (SGLang, vLLM) or with
//!   the finish reason. A stream that ends without a finish reason or without usage ends with
//!   an `error` event instead: never a message that looks complete (fail-closed).
//! - tool call fragments are keyed by the OpenAI `index` (the `id` comes only in the
//!   first); a fragment for a tool call already closed is an error, as its block cannot be
//!   reopened.
//! - an engine error chunk (`{"error": {...}}`, SGLang and vLLM) becomes an `error` event and
//!   ends the translation.
//! - thinking blocks start with `signature: ""` and no `signature_delta` follows (the
//!   gateway signs nothing; vLLM sends a random hex).

use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};

use super::error::{error_type, AnthropicError};
use super::response::{reasoning, stop_reason};

/// One Anthropic server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The SSE event name, also the `type` inside `data`.
    pub name: &'static str,
    pub data: Value,
}

// === impl Event ===

impl Event {
    /// `data` with `type` set to the event name, first, as Anthropic writes it.
    fn new(name: &'static str, data: Value) -> Self {
        let mut map = Map::new();
        map.insert("type".into(), name.into());
        if let Value::Object(fields) = data {
            map.extend(fields);
        }
        Self {
            name,
            data: Value::Object(map),
        }
    }

    /// The wire form: `event: <name>\ndata: <json>\n\n`.
    pub fn to_sse(&self) -> Bytes {
        Bytes::from(format!("event: {}\ndata: {}\n\n", self.name, self.data))
    }
}

/// Anthropic's mid-stream error event (`event: error`), for failures after the 200 was sent.
pub fn error_event(err_type: &str, message: &str) -> Event {
    Event::new(
        "error",
        json!({"error": {"type": err_type, "message": message}}),
    )
}

/// The content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    /// The OpenAI `index` of the tool call it streams.
    Tool(u64),
}

/// Translates one streamed chat completion. Feed each parsed chunk to
/// [`on_chunk`](Self::on_chunk) and call [`finish`](Self::finish) at `[DONE]`.
#[derive(Debug)]
pub struct StreamTranslator {
    model: String,
    message_id: String,
    stop_sequences: Vec<String>,
    input_tokens: Option<u64>,
    started: bool,
    /// An error event or `message_stop` was produced: nothing more is.
    done: bool,
    /// The open block and its Anthropic index.
    open: Option<(Block, u64)>,
    next_index: u64,
    tools_seen: Vec<u64>,
    finish: Option<(&'static str, Value)>,
    usage: Option<(u64, u64)>,
}

// === impl StreamTranslator ===

impl StreamTranslator {
    /// A translator for one answer, reported under `model` with id `message_id`
    /// (`response::message_id` derives one from the engine's id).
    pub fn new(model: impl Into<String>, message_id: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            message_id: message_id.into(),
            stop_sequences: Vec::new(),
            input_tokens: None,
            started: false,
            done: false,
            open: None,
            next_index: 0,
            tools_seen: Vec::new(),
            finish: None,
            usage: None,
        }
    }

    /// The prompt's token count for `message_start`, when the engine's first chunk has none.
    pub fn with_input_tokens(mut self, input_tokens: u64) -> Self {
        self.input_tokens = Some(input_tokens);
        self
    }

    /// The request's `stop_sequences`, to report `stop_sequence` stops.
    pub fn with_stop_sequences(mut self, stop_sequences: Vec<String>) -> Self {
        self.stop_sequences = stop_sequences;
        self
    }

    /// Events for one chunk. An `Err` is a chunk that cannot be translated: send
    /// `error_event` for it and stop.
    pub fn on_chunk(&mut self, chunk: &Value) -> Result<Vec<Event>, AnthropicError> {
        if self.done {
            return Ok(Vec::new());
        }
        let obj = chunk
            .as_object()
            .ok_or_else(|| upstream("a chunk is not a JSON object"))?;
        if let Some(err) = engine_error(obj) {
            self.done = true;
            return Ok(vec![err]);
        }
        let mut events = Vec::new();
        let usage = obj.get("usage").filter(|u| !u.is_null());
        if !self.started {
            self.started = true;
            let from_chunk = usage
                .and_then(|u| u.get("prompt_tokens"))
                .and_then(Value::as_u64);
            events.push(self.message_start(from_chunk.or(self.input_tokens).unwrap_or(0)));
        }
        if let Some(u) = usage {
            let get = |k: &str| u.get(k).and_then(Value::as_u64);
            if let (Some(input), Some(output)) = (get("prompt_tokens"), get("completion_tokens")) {
                self.usage = Some((input, output));
            }
        }
        let choices = match obj.get("choices") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(c)) => c.as_slice(),
            Some(_) => return Err(upstream("a chunk's `choices` is not a list")),
        };
        for choice in choices {
            let choice = choice
                .as_object()
                .ok_or_else(|| upstream("a choice is not an object"))?;
            if choice.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                return Err(upstream("the engine streamed more than one choice"));
            }
            self.on_choice(choice, &mut events)?;
        }
        Ok(events)
    }

    /// Events at the end of the engine's stream (`[DONE]`): the open block's stop,
    /// `message_delta` and `message_stop`, or an `error` event when the stream ended
    /// without a finish reason or usage.
    pub fn finish(&mut self) -> Vec<Event> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        let mut events = Vec::new();
        if !self.started {
            events.push(self.message_start(self.input_tokens.unwrap_or(0)));
        }
        self.close(&mut events);
        let Some((reason, sequence)) = self.finish.take() else {
            events.push(api_error(
                "the engine's stream ended without a finish reason",
            ));
            return events;
        };
        let Some((input, output)) = self.usage else {
            events.push(api_error("the engine's stream ended without usage"));
            return events;
        };
        events.push(Event::new(
            "message_delta",
            json!({
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": {"input_tokens": input, "output_tokens": output},
            }),
        ));
        events.push(Event::new("message_stop", json!({})));
        events
    }

    fn message_start(&self, input_tokens: u64) -> Event {
        Event::new(
            "message_start",
            json!({"message": {
                "id": self.message_id,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 0},
            }}),
        )
    }

    fn on_choice(
        &mut self,
        choice: &Map<String, Value>,
        events: &mut Vec<Event>,
    ) -> Result<(), AnthropicError> {
        if let Some(delta) = choice.get("delta").and_then(Value::as_object) {
            if let Some(thought) = reasoning(delta).filter(|t| !t.is_empty()) {
                let index = self.enter(
                    Block::Thinking,
                    events,
                    || json!({"type": "thinking", "thinking": "", "signature": ""}),
                );
                events.push(block_delta(
                    index,
                    json!({"type": "thinking_delta", "thinking": thought}),
                ));
            }
            match delta.get("content") {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) if s.is_empty() => {}
                Some(Value::String(s)) => {
                    let index =
                        self.enter(Block::Text, events, || json!({"type": "text", "text": ""}));
                    events.push(block_delta(index, json!({"type": "text_delta", "text": s})));
                }
                Some(_) => return Err(upstream("a delta's `content` is not a string")),
            }
            match delta.get("tool_calls") {
                None | Some(Value::Null) => {}
                Some(Value::Array(calls)) => {
                    for call in calls {
                        self.on_tool_fragment(call, events)?;
                    }
                }
                Some(_) => return Err(upstream("a delta's `tool_calls` is not a list")),
            }
        }
        if let Some(finish) = choice.get("finish_reason").and_then(Value::as_str) {
            let has_tools = !self.tools_seen.is_empty();
            self.finish = Some(stop_reason(
                Some(finish),
                choice,
                has_tools,
                &self.stop_sequences,
            )?);
        }
        Ok(())
    }

    fn on_tool_fragment(
        &mut self,
        call: &Value,
        events: &mut Vec<Event>,
    ) -> Result<(), AnthropicError> {
        let call_index = call
            .get("index")
            .and_then(Value::as_u64)
            .ok_or_else(|| upstream("a tool call fragment has no `index`"))?;
        let function = call.get("function");
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let current = self.open;
        let index = match current {
            Some((Block::Tool(i), index)) if i == call_index => index,
            _ => {
                if self.tools_seen.contains(&call_index) {
                    return Err(upstream(&format!(
                        "tool call {call_index} resumed after its block was closed"
                    )));
                }
                let id = call
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                let name = function
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty());
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(upstream(&format!(
                        "tool call {call_index} began without an id and a name"
                    )));
                };
                self.tools_seen.push(call_index);
                self.enter(
                    Block::Tool(call_index),
                    events,
                    || json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                )
            }
        };
        if !arguments.is_empty() {
            events.push(block_delta(
                index,
                json!({"type": "input_json_delta", "partial_json": arguments}),
            ));
        }
        Ok(())
    }

    /// The index of an open `block`, opening it (and closing another) when needed.
    fn enter(
        &mut self,
        block: Block,
        events: &mut Vec<Event>,
        start: impl FnOnce() -> Value,
    ) -> u64 {
        if let Some((open, index)) = self.open {
            if open == block {
                return index;
            }
        }
        self.close(events);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((block, index));
        events.push(Event::new(
            "content_block_start",
            json!({"index": index, "content_block": start()}),
        ));
        index
    }

    fn close(&mut self, events: &mut Vec<Event>) {
        if let Some((_, index)) = self.open.take() {
            events.push(Event::new("content_block_stop", json!({"index": index})));
        }
    }
}

fn block_delta(index: u64, delta: Value) -> Event {
    Event::new(
        "content_block_delta",
        json!({"index": index, "delta": delta}),
    )
}

/// An engine's error chunk as an `error` event: `{"error": {"message", "code"}}` (SGLang,
/// newer vLLM) or `{"object": "error", "message", "code"}` (older vLLM).
fn engine_error(obj: &Map<String, Value>) -> Option<Event> {
    let err = match obj.get("error") {
        Some(Value::Object(e)) => e,
        _ if obj.get("object").and_then(Value::as_str) == Some("error") => obj,
        _ => return None,
    };
    let message = err
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the engine failed mid-stream");
    let status = err
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.is_client_error() || s.is_server_error())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    Some(error_event(error_type(status), message))
}

fn api_error(message: &str) -> Event {
    error_event("api_error", message)
}

fn upstream(message: &str) -> AnthropicError {
    AnthropicError::Upstream(message.to_owned())
}
