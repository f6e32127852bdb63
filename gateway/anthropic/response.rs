//! An OpenAI chat completion → an Anthropic message (`POST /v1/messages`, not streamed).
//!
//! Follows vLLM `vllm/entrypoints/anthropic/serving.py` `messages_full_converter`: a
//! thinking block from the reasoning text, a text block, then one `tool_use` block per tool
//! call; `stop` → `end_turn`, `length` → `max_tokens`, `tool_calls` → `tool_use`. Where the
//! gateway is stricter:
//! - tool call arguments that are not a JSON object are an error (vLLM's `json.loads` would
//!   raise too; a silent `{}` would run the client's tool with the wrong input);
//! - a finish reason outside those three (`abort`, `content_filter`, none) is an error, never
//!   a message that looks complete;
//! - `usage` is required: Anthropic's message always carries it;
//! - `stop` with tool calls is `tool_use` (clients loop on that stop reason);
//! - `stop` caused by one of the request's `stop_sequences` is `stop_sequence`, with the
//!   string: SGLang reports it as the choice's `matched_stop`, vLLM as its `stop_reason`
//!   (a token id there, an integer, is EOS and stays `end_turn`);
//! - the thinking block's `signature` is empty: the gateway signs nothing (vLLM puts a
//!   random hex there, which verifies nothing either).
//!
//! The reasoning text is read from `reasoning_content` (SGLang, older vLLM) or `reasoning`
//! (newer vLLM).

use serde_json::{json, Map, Value};

use super::error::AnthropicError;

/// Translates a chat completion into Anthropic's message. `stop_sequences` are the
/// request's (`request::stop_sequences`), to recognize a stop sequence among stop strings.
pub fn from_chat(
    chat: &Value,
    model: &str,
    stop_sequences: &[String],
) -> Result<Value, AnthropicError> {
    let id = chat
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| upstream("the completion has no `id`"))?;
    let choice = chat
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .and_then(Value::as_object)
        .ok_or_else(|| upstream("the completion has no choice"))?;
    let message = choice
        .get("message")
        .and_then(Value::as_object)
        .ok_or_else(|| upstream("the choice has no `message`"))?;
    let mut content = Vec::new();
    if let Some(thought) = reasoning(message).filter(|t| !t.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": thought, "signature": ""}));
    }
    match message.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) => content.push(json!({"type": "text", "text": s})),
        Some(_) => return Err(upstream("the message's `content` is not a string")),
    }
    let calls = match message.get("tool_calls") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(calls)) => calls.as_slice(),
        Some(_) => return Err(upstream("`tool_calls` is not a list")),
    };
    for (i, call) in calls.iter().enumerate() {
        content.push(tool_use(i, call)?);
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let (stop_reason, stop_sequence) =
        stop_reason(finish, choice, !calls.is_empty(), stop_sequences)?;
    let usage = chat
        .get("usage")
        .ok_or_else(|| upstream("the completion has no `usage`"))?;
    Ok(json!({
        "id": message_id(id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": count(usage, "prompt_tokens")?,
            "output_tokens": count(usage, "completion_tokens")?,
        },
    }))
}

/// `POST /v1/messages/count_tokens`' answer.
pub fn count_tokens_reply(input_tokens: u64) -> Value {
    json!({"input_tokens": input_tokens})
}

/// An Anthropic message id from the engine's completion id: `msg_` and the id without its
/// OpenAI `chatcmpl-` prefix, so the two can be matched in logs.
pub fn message_id(chat_id: &str) -> String {
    let bare = chat_id.strip_prefix("chatcmpl-").unwrap_or(chat_id);
    format!("msg_{bare}")
}

/// The reasoning text of a message or a stream delta.
pub(super) fn reasoning(obj: &Map<String, Value>) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|k| obj.get(*k).and_then(Value::as_str))
}

/// Anthropic's `stop_reason` and `stop_sequence` for a finish reason.
pub(super) fn stop_reason(
    finish: Option<&str>,
    choice: &Map<String, Value>,
    has_tool_calls: bool,
    stop_sequences: &[String],
) -> Result<(&'static str, Value), AnthropicError> {
    match finish {
        Some("stop") if has_tool_calls => Ok(("tool_use", Value::Null)),
        Some("stop") => {
            let matched = ["matched_stop", "stop_reason"]
                .iter()
                .find_map(|k| choice.get(*k).and_then(Value::as_str))
                .filter(|s| stop_sequences.iter().any(|q| q == s));
            Ok(match matched {
                Some(s) => ("stop_sequence", s.into()),
                None => ("end_turn", Value::Null),
            })
        }
        Some("length") => Ok(("max_tokens", Value::Null)),
        Some("tool_calls") => Ok(("tool_use", Value::Null)),
        Some(other) => Err(upstream(&format!("the engine finished with `{other}`"))),
        None => Err(upstream("the choice has no finish reason")),
    }
}

fn tool_use(i: usize, call: &Value) -> Result<Value, AnthropicError> {
    let id = call
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| upstream(&format!("tool call {i} has no `id`")))?;
    let function = call
        .get("function")
        .ok_or_else(|| upstream(&format!("tool call {i} has no `function`")))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| upstream(&format!("tool call {i} has no function name")))?;
    let arguments = function
        .get("arguments")
        .and_then(Value::as_str)
        .unwrap_or("");
    let input = parse_arguments(arguments).ok_or_else(|| {
        upstream(&format!(
            "tool call {i} (`{name}`) has arguments that are not a JSON object: {arguments}"
        ))
    })?;
    Ok(json!({"type": "tool_use", "id": id, "name": name, "input": input}))
}

/// Arguments as Anthropic's `input` object. An empty string is a call without arguments
/// (some engines' parsers send `""` for `{}`); anything else must be a JSON object.
fn parse_arguments(arguments: &str) -> Option<Value> {
    if arguments.trim().is_empty() {
        return Some(json!({}));
    }
    serde_json::from_str::<Value>(arguments)
        .ok()
        .filter(Value::is_object)
}

fn count(usage: &Value, key: &str) -> Result<u64, AnthropicError> {
    usage
        .get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| upstream(&format!("`usage.{key}` is missing")))
}

fn upstream(message: &str) -> AnthropicError {
    AnthropicError::Upstream(message.to_owned())
}
