//! A streamed `/v1/responses` answer's events, as sglang 0.5.23 sends them
//! (`_responses_stream_generator_non_harmony`, `serving_responses.py`, dumping the
//! `openai.types.responses` event models): `event: <type>` and `data: <json>` per event,
//! numbered by `sequence_number`: `response.created`, `response.in_progress`, then per
//! output item `response.output_item.added`, its part's `added` event, the deltas
//! (`response.output_text.delta`, `response.reasoning_text.delta` or its summary form,
//! `response.function_call_arguments.delta`), the `done` events (`_close_message_item`,
//! `_close_reasoning_item`, `_close_tool_call_state`), and last `response.completed`,
//! `response.incomplete` or `response.failed`; no `[DONE]`.
//!
//! The first event of each of the answer's pieces carries its token wait, so the stream is
//! paced as a chat's is.

use bytes::Bytes;
use serde_json::{json, Value};

use super::answer::{Answer, Delta};
use super::reply::Event;
use super::request::random_hex;
use super::responses_output::{call_ids, call_item, message_item, output_text, reasoning_item};
use super::responses_request::ResponsesRequest;

/// The stream's events, numbered; what it ends with is up to the caller.
pub(crate) struct Events {
    pub(crate) events: Vec<Event>,
    next: u64,
}

impl Events {
    /// `response.created` and `response.in_progress` of `initial`.
    pub(crate) fn open(initial: &Value) -> Self {
        let mut events = Self {
            events: Vec::new(),
            next: 0,
        };
        for kind in ["response.created", "response.in_progress"] {
            events.push(false, kind, json!({"response": initial}));
        }
        events
    }

    /// One `event: <kind>` with `fields`, its `type` and `sequence_number` added.
    pub(crate) fn push(&mut self, token: bool, kind: &str, fields: Value) {
        let mut payload = fields;
        if let Some(map) = payload.as_object_mut() {
            map.insert("type".into(), json!(kind));
            map.insert("sequence_number".into(), json!(self.next));
        }
        self.next += 1;
        self.events.push(Event {
            token,
            data: Bytes::from(format!("event: {kind}\ndata: {payload}\n\n")),
        });
    }

    /// The terminal `response.<status>` event.
    pub(crate) fn close(mut self, response: &Value) -> Vec<Event> {
        let status = response
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("failed");
        self.push(
            false,
            &format!("response.{status}"),
            json!({"response": response}),
        );
        self.events
    }
}

/// An item open in the stream.
enum Open {
    Reasoning {
        id: String,
        index: usize,
        text: String,
    },
    Message {
        id: String,
        index: usize,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        index: usize,
        name: String,
        arguments: String,
    },
}

/// Streams `answer`'s pieces as item events; returns the items it completed, in order.
/// With `close_items` false (an error cut the stream), open items stay open.
pub(crate) fn stream_items(
    req: &ResponsesRequest,
    answer: &Answer,
    events: &mut Events,
    close_items: bool,
) -> Vec<Value> {
    let mut done = Vec::new();
    let mut open: Option<Open> = None;
    let mut next_index = 0;
    for piece in &answer.pieces {
        let mut token = piece.token;
        let mut emit = |events: &mut Events, kind: &str, fields: Value| {
            events.push(token, kind, fields);
            token = false;
        };
        let same = matches!(
            (&open, &piece.delta),
            (Some(Open::Reasoning { .. }), Delta::Reasoning(_))
                | (Some(Open::Message { .. }), Delta::Content(_))
                | (Some(Open::Call { .. }), Delta::ToolArgs(_))
        );
        if !same {
            if let Some(item) = open.take() {
                done.push(close(req, item, events));
            }
            let index = next_index;
            next_index += 1;
            open = Some(match &piece.delta {
                Delta::Reasoning(_) => {
                    let id = format!("rs_{}", random_hex());
                    let item = reasoning_item(req, &id, "", "in_progress");
                    emit(
                        events,
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    );
                    let (kind, part) = if req.wants_summary() {
                        (
                            "response.reasoning_summary_part.added",
                            json!({"summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
                        )
                    } else {
                        (
                            "response.content_part.added",
                            json!({"content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
                        )
                    };
                    let mut fields = json!({"item_id": id, "output_index": index});
                    merge(&mut fields, part);
                    emit(events, kind, fields);
                    Open::Reasoning {
                        id,
                        index,
                        text: String::new(),
                    }
                }
                Delta::Content(_) => {
                    let id = format!("msg_{}", random_hex());
                    emit(
                        events,
                        "response.output_item.added",
                        json!({"output_index": index, "item": message_item(&id, "", "in_progress")}),
                    );
                    emit(
                        events,
                        "response.content_part.added",
                        json!({
                            "output_index": index, "item_id": id, "content_index": 0, "part": output_text(""),
                        }),
                    );
                    Open::Message {
                        id,
                        index,
                        text: String::new(),
                    }
                }
                Delta::ToolHead | Delta::ToolArgs(_) => {
                    let (id, call_id) = call_ids();
                    let name = answer
                        .tool_call
                        .as_ref()
                        .map(|c| c.name.clone())
                        .unwrap_or_default();
                    emit(
                        events,
                        "response.output_item.added",
                        json!({
                            "output_index": index, "item": call_item(&id, &call_id, &name, "", "in_progress"),
                        }),
                    );
                    Open::Call {
                        id,
                        call_id,
                        index,
                        name,
                        arguments: String::new(),
                    }
                }
            });
        }
        match (&mut open, &piece.delta) {
            (Some(Open::Reasoning { id, index, text }), Delta::Reasoning(delta)) => {
                text.push_str(delta);
                let (kind, at) = if req.wants_summary() {
                    (
                        "response.reasoning_summary_text.delta",
                        json!({"summary_index": 0}),
                    )
                } else {
                    ("response.reasoning_text.delta", json!({"content_index": 0}))
                };
                let mut fields = json!({"item_id": id, "output_index": index, "delta": delta});
                merge(&mut fields, at);
                emit(events, kind, fields);
            }
            (Some(Open::Message { id, index, text }), Delta::Content(delta)) => {
                text.push_str(delta);
                emit(
                    events,
                    "response.output_text.delta",
                    json!({
                        "content_index": 0, "output_index": index, "item_id": id, "delta": delta, "logprobs": [],
                    }),
                );
            }
            (
                Some(Open::Call {
                    id,
                    index,
                    arguments,
                    ..
                }),
                Delta::ToolArgs(delta),
            ) => {
                arguments.push_str(delta);
                emit(
                    events,
                    "response.function_call_arguments.delta",
                    json!({"item_id": id, "output_index": index, "delta": delta}),
                );
            }
            _ => {}
        }
    }
    if close_items {
        if let Some(item) = open.take() {
            done.push(close(req, item, events));
        }
    }
    done
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

/// The `done` events of an open item; returns the completed item.
fn close(req: &ResponsesRequest, item: Open, events: &mut Events) -> Value {
    match item {
        Open::Reasoning { id, index, text } => {
            let completed = reasoning_item(req, &id, &text, "completed");
            if req.wants_summary() {
                events.push(
                    false,
                    "response.reasoning_summary_text.done",
                    json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text}),
                );
                events.push(
                    false,
                    "response.reasoning_summary_part.done",
                    json!({
                        "item_id": id, "output_index": index, "summary_index": 0,
                        "part": {"type": "summary_text", "text": text},
                    }),
                );
            } else {
                events.push(
                    false,
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                events.push(
                    false,
                    "response.content_part.done",
                    json!({
                        "item_id": id, "output_index": index, "content_index": 0,
                        "part": {"type": "reasoning_text", "text": text},
                    }),
                );
            }
            events.push(
                false,
                "response.output_item.done",
                json!({"output_index": index, "item": completed}),
            );
            completed
        }
        Open::Message { id, index, text } => {
            let completed = message_item(&id, &text, "completed");
            events.push(false, "response.output_text.done", json!({
                "output_index": index, "content_index": 0, "text": text, "logprobs": [], "item_id": id,
            }));
            events.push(false, "response.content_part.done", json!({
                "item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text),
            }));
            events.push(
                false,
                "response.output_item.done",
                json!({"output_index": index, "item": completed}),
            );
            completed
        }
        Open::Call {
            id,
            call_id,
            index,
            name,
            arguments,
        } => {
            let completed = call_item(&id, &call_id, &name, &arguments, "completed");
            events.push(
                false,
                "response.function_call_arguments.done",
                json!({
                    "item_id": id, "output_index": index, "arguments": arguments, "name": name,
                }),
            );
            events.push(
                false,
                "response.output_item.done",
                json!({"output_index": index, "item": completed}),
            );
            completed
        }
    }
}
