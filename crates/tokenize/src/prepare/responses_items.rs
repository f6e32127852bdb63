//! Responses input items as chat messages, as sglang 0.5.23 converts them for
//! `_make_request` (`serving_responses.py`): each item (`_normalize_response_message_for_chat`,
//! `_normalize_response_content_part_for_chat`, `label_developer_content`), then consecutive
//! assistant messages merged (`_merge_consecutive_assistant_messages`) and, when the
//! template renders no system message after the first turn, the system messages coalesced
//! into one leading block (`_construct_input_messages`, `detect_inline_system_support`).

use serde_json::{json, Map, Value};

use super::fields::py_repr;

/// `DEVELOPER_BLOCK_LABEL` (`responses_adapters.py`).
const DEVELOPER_LABEL: &str = "Developer instructions:";

/// `_normalize_response_message_for_chat`: one input item as a chat message (`None`: an
/// empty reasoning item, dropped).
pub(super) fn chat_message(item: &Value) -> Result<Option<Value>, String> {
    let Some(item) = item.as_object() else {
        return Ok(Some(item.clone()));
    };
    let mut item = item.clone();
    if item.get("role").and_then(Value::as_str) == Some("developer") {
        item.insert("role".into(), json!("system"));
        let content = item.get("content").cloned().unwrap_or(Value::Null);
        item.insert("content".into(), labelled(content));
    }
    match item.get("type").and_then(Value::as_str) {
        Some("function_call") => {
            let arguments = match item.get("arguments") {
                Some(Value::String(raw)) => match serde_json::from_str::<Value>(raw) {
                    Ok(Value::Object(_)) => raw.clone(),
                    _ => "{}".into(),
                },
                Some(v @ Value::Object(_)) => v.to_string(),
                _ => "{}".into(),
            };
            let id = item
                .get("call_id")
                .filter(|v| !v.is_null())
                .or_else(|| item.get("id"));
            Ok(Some(json!({"role": "assistant", "tool_calls": [{
                "id": id, "type": "function",
                "function": {"name": item.get("name"), "arguments": arguments},
            }]})))
        }
        Some("function_call_output" | "custom_tool_call_output") => {
            let output = match item.get("output") {
                Some(Value::Array(parts)) => Value::String(
                    parts
                        .iter()
                        .filter_map(|p| p.get("text").and_then(Value::as_str))
                        .collect(),
                ),
                Some(v) => v.clone(),
                None => json!(""),
            };
            Ok(Some(
                json!({"role": "tool", "tool_call_id": item.get("call_id"), "content": output}),
            ))
        }
        Some("reasoning") => {
            let texts = |key: &str| -> Vec<String> {
                item.get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.get("text").and_then(Value::as_str))
                    .filter(|t| !t.is_empty())
                    .map(str::to_string)
                    .collect()
            };
            let mut parts = texts("summary");
            if parts.is_empty() {
                parts = texts("content");
            }
            Ok((!parts.is_empty())
                .then(|| json!({"role": "assistant", "reasoning_content": parts.join("\n")})))
        }
        None | Some("message") => {
            let mut out = Map::new();
            for (k, v) in item {
                if v.is_null() || ["id", "status", "type"].contains(&k.as_str()) {
                    continue;
                }
                let v = match (k.as_str(), v) {
                    ("content", Value::Array(parts)) => {
                        Value::Array(parts.into_iter().map(chat_part).collect())
                    }
                    (_, v) => v,
                };
                out.insert(k, v);
            }
            Ok(Some(Value::Object(out)))
        }
        Some(other) => Err(format!(
            "Unsupported Responses API input item type: {}",
            py_repr(other)
        )),
    }
}

/// `_normalize_response_content_part_for_chat`.
fn chat_part(part: Value) -> Value {
    let Some(map) = part.as_object() else {
        return part;
    };
    match map.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text") => {
            json!({"type": "text", "text": map.get("text").cloned().unwrap_or(json!(""))})
        }
        Some("input_image") => {
            let mut image = match map.get("image_url") {
                Some(Value::Object(o)) => o.clone(),
                other => {
                    let mut o = Map::new();
                    o.insert("url".into(), other.cloned().unwrap_or(Value::Null));
                    o
                }
            };
            if image
                .get("detail")
                .is_none_or(|d| d.as_str().is_none_or(str::is_empty))
            {
                let detail = map.get("detail").filter(|d| !d.is_null()).cloned();
                image.insert("detail".into(), detail.unwrap_or(json!("auto")));
            }
            json!({"type": "image_url", "image_url": image})
        }
        _ => part,
    }
}

/// `label_developer_content`: the developer block's text prefixed with its label.
fn labelled(content: Value) -> Value {
    match content {
        Value::String(s) => Value::String(format!("{DEVELOPER_LABEL}\n{s}")),
        Value::Array(mut parts) => {
            if let Some(part) = parts
                .iter_mut()
                .find(|p| p.get("text").is_some_and(Value::is_string))
            {
                let text = part.get("text").and_then(Value::as_str).unwrap_or_default();
                let text = format!("{DEVELOPER_LABEL}\n{text}");
                if let Some(map) = part.as_object_mut() {
                    map.insert("text".into(), json!(text));
                }
            }
            Value::Array(parts)
        }
        other => other,
    }
}

/// `_merge_consecutive_assistant_messages`.
pub(super) fn merge_assistants(messages: Vec<Value>) -> Vec<Value> {
    let mut merged: Vec<Value> = Vec::new();
    for message in messages {
        let is_assistant = |m: &Value| m.get("role").and_then(Value::as_str) == Some("assistant");
        let mergeable = merged.last().is_some_and(|prev| {
            is_assistant(prev)
                && is_assistant(&message)
                && (prev.get("phase") == message.get("phase") || reasoning_only(prev))
        });
        let (Some(Value::Object(prev)), true) = (merged.last_mut(), mergeable) else {
            merged.push(message);
            continue;
        };
        if let Some(phase) = message.get("phase").filter(|p| !p.is_null()) {
            prev.insert("phase".into(), phase.clone());
        }
        match message.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s.is_empty() => {}
            Some(new) => {
                let joined = match prev.get("content") {
                    None | Some(Value::Null) => new.clone(),
                    Some(Value::String(p)) if p.is_empty() => new.clone(),
                    Some(Value::String(p)) if new.is_string() => {
                        json!(format!("{p}\n\n{}", new.as_str().unwrap_or_default()))
                    }
                    Some(old) => Value::Array([as_parts(old), as_parts(new)].concat()),
                };
                prev.insert("content".into(), joined);
            }
        }
        if let Some(Value::Array(calls)) = message.get("tool_calls") {
            let mut all = prev
                .get("tool_calls")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            all.extend(calls.iter().cloned());
            prev.insert("tool_calls".into(), Value::Array(all));
        }
        if let Some(new) = message
            .get("reasoning_content")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
        {
            let joined = match prev
                .get("reasoning_content")
                .and_then(Value::as_str)
                .filter(|r| !r.is_empty())
            {
                Some(old) => format!("{old}\n{new}"),
                None => new.to_string(),
            };
            prev.insert("reasoning_content".into(), json!(joined));
        }
    }
    merged
}

fn reasoning_only(message: &Value) -> bool {
    message.as_object().is_some_and(|m| {
        m.len() == 2 && m.contains_key("role") && m.contains_key("reasoning_content")
    })
}

fn as_parts(content: &Value) -> Vec<Value> {
    match content {
        Value::Array(parts) => parts.clone(),
        Value::String(s) if !s.is_empty() => vec![json!({"type": "text", "text": s})],
        _ => Vec::new(),
    }
}

/// The system messages joined into one leading block (`_construct_input_messages`).
pub(super) fn coalesce_system(messages: Vec<Value>) -> Vec<Value> {
    let mut chunks: Vec<String> = Vec::new();
    let mut others = Vec::new();
    for message in messages {
        if message.get("role").and_then(Value::as_str) != Some("system") {
            others.push(message);
            continue;
        }
        match message.get("content") {
            Some(Value::String(s)) => chunks.push(s.clone()),
            Some(Value::Array(parts)) => chunks.extend(
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .map(str::to_string),
            ),
            _ => {}
        }
    }
    if chunks.is_empty() {
        return others;
    }
    let mut out = vec![json!({"role": "system", "content": chunks.join("\n\n")})];
    out.extend(others);
    out
}
