//! An Anthropic message and its content blocks → the chat messages SGLang makes of them
//! (see `anthropic.rs` for the SGLang sources and commits read). The subset on which SGLang
//! versions agree:
//! - string content → `{role, content}`;
//! - `text` blocks (non-empty) → text parts; one text part becomes a plain string;
//! - an assistant's `tool_use` → a tool call whose arguments are Python's
//!   `json.dumps(input or {})` (`ensure_ascii`, `", "` and `": "`);
//! - a user's `tool_result` → a `{role: "tool", tool_call_id, content}` message, emitted
//!   where the block is; text after every `tool_result` → one user message after them.
//!
//! Refused, because versions differ: text before a `tool_result` (older emits the tool
//! messages first, newer flushes the text first), empty text blocks (older drops them,
//! newer keeps them), an assistant turn with nothing left (older drops it, newer sends
//! `""`), `thinking`/`redacted_thinking` history (dropped by older, wrapped per
//! `--reasoning-parser` or refused by newer), images, documents, search results, tool
//! references and server-tool blocks (converted differently or not at all).

use serde_json::{json, Map, Value};

use super::anthropic_fields::{
    field, invalid, join, only_keys, unsupported, wrong_type, Converted,
};
use crate::pyjson::python_dumps;

/// Why a block type is refused.
fn refused_block(kind: &str) -> &'static str {
    match kind {
        "image" => "images: kvgate counts text prompts only (image tokens depend on the model's processor)",
        "document" => "documents: older SGLang rejects the block type, newer versions differ in what they keep",
        "search_result" => "search results: older SGLang rejects or drops them, newer flattens them to text",
        "tool_reference" => "tool references: rendered by the chat template of newer SGLang only",
        "thinking" | "redacted_thinking" => {
            "thinking history: older SGLang drops it, newer wraps it per --reasoning-parser (or refuses redacted_thinking)"
        }
        "server_tool_use" | "web_search_tool_result" | "web_fetch_tool_result"
        | "code_execution_tool_result" | "bash_code_execution_tool_result"
        | "text_editor_code_execution_tool_result" | "mcp_tool_use" | "mcp_tool_result"
        | "container_upload" => "server tool blocks have no equivalent in SGLang",
        _ => "an unknown block type: SGLang versions differ in rejecting or skipping it",
    }
}

/// The non-empty texts of a list of `text` blocks (system blocks, tool_result content):
/// any other block is refused. `cache_control` (a caching hint) is dropped.
pub(super) fn text_blocks(blocks: &[Value], path: &str) -> Converted<Vec<String>> {
    let mut texts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let path = format!("{path}[{i}]");
        let block = block_object(block, &path)?;
        let kind = block_type(block, &path)?;
        if kind != "text" {
            return Err(unsupported(&join(&path, "type"), refused_block(kind)));
        }
        let text = text_of(block, &path)?;
        if !text.is_empty() {
            texts.push(text.to_owned());
        }
    }
    Ok(texts)
}

fn block_object<'a>(block: &'a Value, path: &str) -> Converted<&'a Map<String, Value>> {
    block
        .as_object()
        .ok_or_else(|| invalid(path, "Input should be a valid dictionary"))
}

fn block_type<'a>(block: &'a Map<String, Value>, path: &str) -> Converted<&'a str> {
    match block.get("type") {
        Some(Value::String(kind)) => Ok(kind),
        None | Some(Value::Null) => Err(invalid(&join(path, "type"), "Field required")),
        Some(_) => Err(wrong_type(&join(path, "type"), "a string")),
    }
}

/// A `text` block's text (a string; `citations` must be absent or null).
fn text_of<'a>(block: &'a Map<String, Value>, path: &str) -> Converted<&'a str> {
    only_keys(block, &["type", "text", "cache_control", "citations"], path)?;
    if field(block, "citations").is_some() {
        return Err(unsupported(
            &join(path, "citations"),
            "citations: SGLang ignores them; kvgate does not model them",
        ));
    }
    match block.get("text") {
        Some(Value::String(text)) => Ok(text),
        None | Some(Value::Null) => Err(unsupported(
            &join(path, "text"),
            "a text block without text: SGLang skips it, Anthropic refuses it",
        )),
        Some(_) => Err(wrong_type(&join(path, "text"), "a string")),
    }
}

/// The non-empty string of a required id-like field.
fn id_field(block: &Map<String, Value>, key: &str, path: &str, why: &str) -> Converted<String> {
    match block.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        None | Some(Value::Null) | Some(Value::String(_)) => {
            Err(unsupported(&join(path, key), why))
        }
        Some(_) => Err(wrong_type(&join(path, key), "a string")),
    }
}

/// The path of a number that kvgate may print unlike Python: one parsed as a float but
/// integral and past 64-bit integers (the JSON text may have been an exact integer, which
/// Python keeps exact).
fn unprintable_number(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::Number(n) if n.is_f64() => n
            .as_f64()
            .filter(|f| f.fract() == 0.0 && f.abs() >= 9.2e18)
            .map(|_| path.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| unprintable_number(v, &format!("{path}[{i}]"))),
        Value::Object(map) => map
            .iter()
            .find_map(|(k, v)| unprintable_number(v, &join(path, k))),
        _ => None,
    }
}

/// An assistant's `tool_use` block → a chat tool call.
fn tool_call(block: &Map<String, Value>, path: &str) -> Converted<Value> {
    only_keys(
        block,
        &["type", "id", "name", "input", "cache_control"],
        path,
    )?;
    let id = id_field(
        block,
        "id",
        path,
        "a tool_use without id: SGLang makes up a random one",
    )?;
    let name = id_field(
        block,
        "name",
        path,
        "a tool_use without a name: SGLang sends an empty one",
    )?;
    let input = match field(block, "input") {
        None => Map::new(),
        Some(Value::Object(input)) => input.clone(),
        Some(_) => {
            return Err(invalid(
                &join(path, "input"),
                "Input should be a valid dictionary",
            ))
        }
    };
    if let Some(at) = unprintable_number(&Value::Object(input.clone()), &join(path, "input")) {
        return Err(unsupported(
            &at,
            "an integer beyond 64 bits: kvgate's JSON numbers cannot tell how Python's json.dumps would print it",
        ));
    }
    Ok(json!({"id": id, "type": "function", "function": {
        "name": name, "arguments": python_dumps(&Value::Object(input)),
    }}))
}

/// A user's `tool_result` block → a tool message.
fn tool_message(block: &Map<String, Value>, path: &str) -> Converted<Value> {
    only_keys(
        block,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
        path,
    )?;
    let id = id_field(
        block,
        "tool_use_id",
        path,
        "a tool_result without tool_use_id: SGLang falls back to its id or \"\"",
    )?;
    match field(block, "is_error") {
        None | Some(Value::Bool(_)) => {}
        Some(_) => return Err(wrong_type(&join(path, "is_error"), "a boolean")),
    }
    let content_path = join(path, "content");
    let content = match field(block, "content") {
        None => json!(""),
        Some(Value::String(s)) => json!(s),
        Some(Value::Array(items)) => {
            let mut texts = text_blocks(items, &content_path)?;
            match texts.len() {
                0 => json!(""),
                1 => Value::String(texts.remove(0)),
                _ => Value::Array(
                    texts
                        .into_iter()
                        .map(|text| json!({"type": "text", "text": text}))
                        .collect(),
                ),
            }
        }
        Some(_) => {
            return Err(invalid(
                &content_path,
                "Input should be a valid string or list",
            ))
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

/// Text parts as a message's content: one text part is its string.
fn content_of(parts: Vec<Value>) -> Value {
    match parts.as_slice() {
        [only] => only.get("text").cloned().unwrap_or_else(|| only.clone()),
        _ => Value::Array(parts),
    }
}

/// One Anthropic message → the chat messages it becomes, appended to `out`.
pub(super) fn convert_message(path: &str, message: &Value, out: &mut Vec<Value>) -> Converted<()> {
    let Some(message) = message.as_object() else {
        return Err(invalid(path, "Input should be a valid dictionary"));
    };
    only_keys(message, &["role", "content"], path)?;
    let role_path = join(path, "role");
    let role = match message.get("role") {
        Some(Value::String(role)) if role == "user" || role == "assistant" => role.as_str(),
        Some(Value::String(role)) if role == "system" => {
            return Err(unsupported(
                &role_path,
                "a system message inside messages: older SGLang refuses it, newer merges it into the system prompt or keeps it depending on the chat template",
            ))
        }
        None | Some(Value::Null) => return Err(invalid(&role_path, "Field required")),
        Some(_) => return Err(invalid(&role_path, "Input should be 'user' or 'assistant'")),
    };
    let content_path = join(path, "content");
    let blocks = match message.get("content") {
        Some(Value::String(text)) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        None | Some(Value::Null) => return Err(invalid(&content_path, "Field required")),
        Some(_) => {
            return Err(invalid(
                &content_path,
                "Input should be a valid string or list",
            ))
        }
    };
    let mut parts = Vec::new();
    let mut tool_calls = Vec::new();
    let mut tool_results = 0usize;
    for (i, block) in blocks.iter().enumerate() {
        let path = format!("{content_path}[{i}]");
        let block = block_object(block, &path)?;
        match (block_type(block, &path)?, role) {
            ("text", _) => {
                let text = text_of(block, &path)?;
                if text.is_empty() {
                    return Err(unsupported(
                        &join(&path, "text"),
                        "an empty text block: older SGLang drops it, newer keeps it as an empty part",
                    ));
                }
                parts.push(json!({"type": "text", "text": text}));
            }
            ("tool_use", "assistant") => tool_calls.push(tool_call(block, &path)?),
            ("tool_use", _) => {
                return Err(unsupported(
                    &path,
                    "a tool_use in a user message: SGLang attaches tool_calls to a user turn, which chat templates do not render alike",
                ))
            }
            ("tool_result", "user") => {
                if !parts.is_empty() {
                    return Err(unsupported(
                        &path,
                        "text before a tool_result: older SGLang sends the tool messages first, newer the text first",
                    ));
                }
                out.push(tool_message(block, &path)?);
                tool_results += 1;
            }
            ("tool_result", _) => {
                return Err(unsupported(
                    &path,
                    "a tool_result in an assistant message (SGLang inlines it as \"Tool result: ...\" text); kvgate converts user tool results only",
                ))
            }
            (kind, _) => return Err(unsupported(&join(&path, "type"), refused_block(kind))),
        }
    }
    if role == "assistant" {
        if parts.is_empty() && tool_calls.is_empty() {
            return Err(unsupported(
                &content_path,
                "an assistant message with no text and no tool_use: older SGLang drops it, newer sends empty content",
            ));
        }
        let mut msg = Map::new();
        msg.insert("role".into(), json!("assistant"));
        if !tool_calls.is_empty() {
            msg.insert("tool_calls".into(), Value::Array(tool_calls));
        }
        if !parts.is_empty() {
            msg.insert("content".into(), content_of(parts));
        }
        out.push(Value::Object(msg));
        return Ok(());
    }
    if parts.is_empty() {
        if tool_results == 0 {
            return Err(unsupported(
                &content_path,
                "a user message without content: SGLang drops it, Anthropic refuses it",
            ));
        }
        return Ok(());
    }
    out.push(json!({"role": "user", "content": content_of(parts)}));
    Ok(())
}
