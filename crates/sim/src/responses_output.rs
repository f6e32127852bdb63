//! What a `/v1/responses` answer looks like (sglang 0.5.23, `serving_responses.py`, with
//! the `openai.types.responses` models it dumps):
//!
//! - the response object: `ResponsesResponse.from_request` (`protocol.py`), its `usage` in
//!   the Responses shape (`_serialize_usage`: `input_tokens`, `input_tokens_details`,
//!   `output_tokens`, `output_tokens_details`, `total_tokens`), `status` from the finish
//!   (`_status_from_finish_reason`: length → `"incomplete"`, abort → `"failed"` with
//!   `error: {"code": "server_error", "message"}`, `_error_from_finish_reason`);
//! - output items: `_output_items`: a reasoning item (with a reasoning parser), the
//!   assistant message with one `output_text` part, a `function_call` per tool call
//!   (`_make_tool_call_item`); a conversation keeps them without their nulls
//!   (`model_dump(exclude_none=True)`).
//!
//! The stream's events are built in `responses_stream.rs`. What the model says comes from
//! `answer.rs`, as for a chat completion.

use serde_json::{json, Value};

use super::answer::Answer;
use super::reply::unix_now;
use super::request::random_hex;
use super::responses_request::ResponsesRequest;

/// How a response ended.
pub(crate) struct Outcome {
    pub(crate) status: &'static str,
    /// `error` of a failed response.
    pub(crate) error: Value,
    pub(crate) usage: Value,
}

/// The response object of `req` with `output`, as `from_request` fills it.
pub(crate) fn response(
    req: &ResponsesRequest,
    model: &str,
    created_at: u64,
    output: Vec<Value>,
    outcome: &Outcome,
) -> Value {
    let text_only = !output.is_empty()
        && output
            .iter()
            .all(|item| item.get("type").and_then(Value::as_str) == Some("message"));
    let text = match req.echo.get("text").filter(|t| !t.is_null()) {
        Some(text) => text.clone(),
        None if text_only => json!({"format": {"type": "text"}}),
        None => Value::Null,
    };
    let echo = |name: &str| req.echo.get(name).cloned().unwrap_or(Value::Null);
    let metadata = req
        .echo
        .get("metadata")
        .filter(|m| !m.is_null())
        .cloned()
        .unwrap_or_else(|| json!({}));
    json!({
        "id": req.id,
        "object": "response",
        "created_at": created_at,
        "model": model,
        "output": output,
        "status": outcome.status,
        "usage": outcome.usage,
        "parallel_tool_calls": req.prompt.parallel_tool_calls,
        "tool_choice": req.prompt.effective_tool_choice(),
        "tools": req.prompt.tools,
        "error": outcome.error,
        "incomplete_details": if outcome.status == "incomplete" {
            json!({"reason": "max_output_tokens"})
        } else {
            Value::Null
        },
        "instructions": req.prompt.instructions,
        "max_output_tokens": req.prompt.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning_echo(),
        "store": req.store,
        "temperature": echo("temperature"),
        "text": text,
        "top_p": echo("top_p"),
        "truncation": echo("truncation"),
        "user": echo("user"),
        "metadata": metadata,
    })
}

/// A response not yet answered (`queued` in the background, `in_progress` in a stream).
pub(crate) fn pending(
    req: &ResponsesRequest,
    model: &str,
    created_at: u64,
    status: &'static str,
) -> Value {
    let outcome = Outcome {
        status,
        error: Value::Null,
        usage: Value::Null,
    };
    response(req, model, created_at, Vec::new(), &outcome)
}

/// The Responses `usage`.
pub(crate) fn usage(input: usize, output: usize, cached: usize) -> Value {
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input + output,
    })
}

/// The status an answer's finish gives, and a failed one's error.
pub(crate) fn status(finish: &str, abort_message: Option<&str>) -> (&'static str, Value) {
    match finish {
        "length" => ("incomplete", Value::Null),
        "abort" => (
            "failed",
            json!({"code": "server_error", "message": abort_message.unwrap_or("Generation aborted")}),
        ),
        _ => ("completed", Value::Null),
    }
}

pub(crate) fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([output_text(text)])
    };
    json!({"id": id, "content": content, "role": "assistant", "status": status,
           "type": "message", "phase": "final_answer"})
}

pub(crate) fn output_text(text: &str) -> Value {
    json!({"annotations": [], "text": text, "type": "output_text", "logprobs": null})
}

pub(crate) fn reasoning_item(req: &ResponsesRequest, id: &str, text: &str, status: &str) -> Value {
    let done = status == "completed";
    let summary = if req.wants_summary() && done {
        json!([{"type": "summary_text", "text": text}])
    } else {
        json!([])
    };
    let content = if done {
        json!([{"text": text, "type": "reasoning_text"}])
    } else {
        json!([])
    };
    json!({"id": id, "summary": summary, "type": "reasoning", "content": content,
           "encrypted_content": null, "status": status})
}

pub(crate) fn call_item(
    id: &str,
    call_id: &str,
    name: &str,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"arguments": arguments, "call_id": call_id, "name": name,
           "type": "function_call", "id": id, "status": status})
}

pub(crate) fn call_ids() -> (String, String) {
    let hex = random_hex();
    (
        format!("fc_{}", hex.get(..8).unwrap_or_default()),
        format!("call_{}", hex.get(..24).unwrap_or_default()),
    )
}

/// The output items of a whole answer (`_output_items`).
pub(crate) fn items(req: &ResponsesRequest, answer: &Answer) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(reasoning) = answer.reasoning.as_deref().filter(|r| !r.is_empty()) {
        let id = format!("rs_{}", random_hex());
        items.push(reasoning_item(req, &id, reasoning, "completed"));
    }
    if let Some(content) = answer.content.as_deref().filter(|c| !c.is_empty()) {
        items.push(message_item(
            &format!("msg_{}", random_hex()),
            content,
            "completed",
        ));
    }
    if let Some(call) = &answer.tool_call {
        let (id, call_id) = call_ids();
        items.push(call_item(
            &id,
            &call_id,
            &call.name,
            &call.arguments,
            "completed",
        ));
    }
    items
}

/// The output items as a conversation stores them (`model_dump(exclude_none=True)`).
pub(crate) fn stored(items: &[Value]) -> Vec<Value> {
    fn strip(value: &Value) -> Value {
        match value {
            Value::Object(map) => Value::Object(
                map.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), strip(v)))
                    .collect(),
            ),
            Value::Array(list) => Value::Array(list.iter().map(strip).collect()),
            other => other.clone(),
        }
    }
    items.iter().map(strip).collect()
}

/// Seconds since the epoch (`created_at`).
pub(crate) fn now() -> u64 {
    unix_now()
}
