//! Anthropic `system` and `messages` → OpenAI chat `messages`.
//!
//! Follows vLLM `vllm/entrypoints/anthropic/serving.py` (`_convert_system_message`,
//! `_convert_messages`, `_convert_block`, `_convert_user_tool_result`), with these
//! differences, each for the gateway's fail-closed rule or its exact prompt count:
//! - roles other than `user` and `assistant` are refused (Anthropic refuses them; vLLM
//!   folds a `system` role into the system prompt);
//! - blocks the engines cannot render (`document`, `search_result`, file images, …) and
//!   blocks in the wrong role (`tool_use` from the user, `tool_result` from the assistant)
//!   are refused, naming `messages.<i>.content.<j>`; vLLM drops or stringifies them;
//! - system blocks are joined with `\n` (vLLM joins with nothing, gluing sentences);
//! - an assistant turn with tool calls and no text has `content: null`, the shape the
//!   OpenAI SDK sends and kvgate's admission already renders (vLLM omits `content`);
//! - `thinking` blocks become `reasoning_content`, the field SGLang's protocol and Qwen3's
//!   template read (vLLM's newer code writes `reasoning`); `redacted_thinking` is dropped
//!   (opaque, as vLLM does);
//! - `tool_result.is_error` is accepted and dropped: an OpenAI `tool` message has no error
//!   flag (vLLM drops it too), so the result's text must say what failed;
//! - `cache_control` is accepted and dropped everywhere: engines cache prefixes by
//!   themselves.
//!
//! Like vLLM, `tool_result` blocks become `tool` messages placed before the rest of their
//! user turn (Anthropic requires them first in the turn), images inside a tool result follow
//! as a user message of `image_url` parts, and a system text starting
//! `x-anthropic-billing-header` (Claude Code's per-request hash) is dropped so it does not
//! defeat prefix caching.

use serde_json::{json, Map, Value};

use super::error::AnthropicError;
use super::json::present;

/// The converted conversation.
pub(super) struct Converted {
    pub messages: Vec<Value>,
    /// The last turn is the assistant's: the engine continues it (Anthropic's prefill).
    pub continues_final: bool,
}

/// `system` and `messages` of an Anthropic body → chat messages.
pub(super) fn to_chat_messages(body: &Map<String, Value>) -> Result<Converted, AnthropicError> {
    let mut out = Vec::new();
    if let Some(system) = present(body, "system") {
        if let Some(text) = system_text(system)? {
            out.push(json!({"role": "system", "content": text}));
        }
    }
    let list = present(body, "messages")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| {
            AnthropicError::invalid(
                "messages",
                "field required: a non-empty list of {role, content} turns",
            )
        })?;
    let mut last_role = "";
    for (i, msg) in list.iter().enumerate() {
        last_role = message(&format!("messages.{i}"), msg, &mut out)?;
    }
    Ok(Converted {
        messages: out,
        continues_final: last_role == "assistant",
    })
}

fn system_text(system: &Value) -> Result<Option<String>, AnthropicError> {
    let parts = match system {
        Value::String(s) => vec![s.clone()],
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for (j, block) in blocks.iter().enumerate() {
                let path = format!("system.{j}");
                let obj = block_object(block, &path)?;
                if block_type(obj, &path)? != "text" {
                    return Err(AnthropicError::invalid(
                        format!("{path}.type"),
                        "system blocks must be of type \"text\"",
                    ));
                }
                let text = text_of(obj, &path)?;
                if !text.is_empty() && !text.starts_with("x-anthropic-billing-header") {
                    parts.push(text.to_owned());
                }
            }
            parts
        }
        _ => {
            return Err(AnthropicError::invalid(
                "system",
                "expected a string or a list of text blocks",
            ))
        }
    };
    let text = parts.join("\n");
    Ok((!text.is_empty()).then_some(text))
}

/// One Anthropic turn → zero or more chat messages. Returns its role.
fn message(path: &str, msg: &Value, out: &mut Vec<Value>) -> Result<&'static str, AnthropicError> {
    let obj = msg
        .as_object()
        .ok_or_else(|| AnthropicError::invalid(path, "expected an object {role, content}"))?;
    check_keys(obj, path, &["role", "content"])?;
    let role =
        match present(obj, "role").and_then(Value::as_str) {
            Some("user") => "user",
            Some("assistant") => "assistant",
            _ => return Err(AnthropicError::invalid(
                format!("{path}.role"),
                "expected \"user\" or \"assistant\" (put system text in the top-level `system`)",
            )),
        };
    match present(obj, "content") {
        Some(Value::String(s)) => out.push(json!({"role": role, "content": s})),
        Some(Value::Array(blocks)) if role == "user" => user_blocks(path, blocks, out)?,
        Some(Value::Array(blocks)) => out.push(assistant_blocks(path, blocks)?),
        _ => {
            return Err(AnthropicError::invalid(
                format!("{path}.content"),
                "expected a string or a list of content blocks",
            ))
        }
    }
    Ok(role)
}

fn user_blocks(path: &str, blocks: &[Value], out: &mut Vec<Value>) -> Result<(), AnthropicError> {
    let mut parts = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}.content.{j}");
        let obj = block_object(block, &path)?;
        match block_type(obj, &path)? {
            "text" => text_part(obj, &path, &mut parts)?,
            "image" => parts.push(image_part(obj, &path)?),
            "tool_result" => tool_result(obj, &path, out)?,
            other => {
                return Err(wrong_block(
                    &path,
                    other,
                    "user",
                    "text, image, tool_result",
                ))
            }
        }
    }
    if !parts.is_empty() {
        out.push(json!({"role": "user", "content": collapse(parts)}));
    }
    Ok(())
}

fn assistant_blocks(path: &str, blocks: &[Value]) -> Result<Value, AnthropicError> {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning = String::new();
    for (j, block) in blocks.iter().enumerate() {
        let path = format!("{path}.content.{j}");
        let obj = block_object(block, &path)?;
        match block_type(obj, &path)? {
            "text" => text_part(obj, &path, &mut parts)?,
            "tool_use" => calls.push(tool_call(obj, &path)?),
            "thinking" => {
                check_keys(obj, &path, &["type", "thinking", "signature"])?;
                let thought = present(obj, "thinking").and_then(Value::as_str);
                let thought = thought.ok_or_else(|| {
                    AnthropicError::invalid(format!("{path}.thinking"), "expected a string")
                })?;
                reasoning.push_str(thought);
            }
            "redacted_thinking" => check_keys(obj, &path, &["type", "data"])?,
            other => {
                return Err(wrong_block(
                    &path,
                    other,
                    "assistant",
                    "text, tool_use, thinking, redacted_thinking",
                ))
            }
        }
    }
    let mut msg = Map::new();
    msg.insert("role".into(), "assistant".into());
    let content = match (parts.is_empty(), calls.is_empty()) {
        (false, _) => collapse(parts),
        (true, false) => Value::Null,
        (true, true) => Value::String(String::new()),
    };
    msg.insert("content".into(), content);
    if !reasoning.is_empty() {
        msg.insert("reasoning_content".into(), reasoning.into());
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(msg))
}

/// One text part, or its parts as a plain string (vLLM `_convert_message_content`).
fn collapse(mut parts: Vec<Value>) -> Value {
    if parts.len() == 1 && parts[0]["type"] == "text" {
        let mut only = parts.swap_remove(0);
        return only["text"].take();
    }
    Value::Array(parts)
}

fn text_part(
    obj: &Map<String, Value>,
    path: &str,
    parts: &mut Vec<Value>,
) -> Result<(), AnthropicError> {
    check_keys(obj, path, &["type", "text", "cache_control", "citations"])?;
    let text = text_of(obj, path)?;
    // Empty text blocks are skipped, as vLLM `_convert_block` does.
    if !text.is_empty() {
        parts.push(json!({"type": "text", "text": text}));
    }
    Ok(())
}

/// `image` with a `base64` or `url` source → an `image_url` part (vLLM
/// `_convert_image_source_to_url`, which builds the same data URI).
fn image_part(obj: &Map<String, Value>, path: &str) -> Result<Value, AnthropicError> {
    check_keys(obj, path, &["type", "source", "cache_control"])?;
    let path = format!("{path}.source");
    let source = present(obj, "source")
        .and_then(Value::as_object)
        .ok_or_else(|| AnthropicError::invalid(&path, "expected an image source object"))?;
    let field = |key: &str| {
        present(source, key)
            .and_then(Value::as_str)
            .ok_or_else(|| AnthropicError::invalid(format!("{path}.{key}"), "expected a string"))
    };
    let url = match present(source, "type").and_then(Value::as_str) {
        Some("base64") => format!("data:{};base64,{}", field("media_type")?, field("data")?),
        Some("url") => field("url")?.to_owned(),
        _ => {
            return Err(AnthropicError::unsupported(
                format!("{path}.type"),
                "image sources of type \"base64\" or \"url\" only (no Files API here)",
            ))
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// `tool_use` → an OpenAI tool call whose `arguments` is the JSON text of `input`
/// (vLLM `_convert_tool_use_block`).
fn tool_call(obj: &Map<String, Value>, path: &str) -> Result<Value, AnthropicError> {
    check_keys(obj, path, &["type", "id", "name", "input", "cache_control"])?;
    let string = |key: &str| {
        present(obj, key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                AnthropicError::invalid(format!("{path}.{key}"), "expected a non-empty string")
            })
    };
    let (id, name) = (string("id")?, string("name")?);
    let input = present(obj, "input")
        .filter(|v| v.is_object())
        .ok_or_else(|| AnthropicError::invalid(format!("{path}.input"), "expected an object"))?;
    Ok(json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": input.to_string()},
    }))
}

/// `tool_result` → a `tool` message; text blocks joined with `\n`, images after it as a
/// user message (vLLM `_convert_user_tool_result`).
fn tool_result(
    obj: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Value>,
) -> Result<(), AnthropicError> {
    check_keys(
        obj,
        path,
        &[
            "type",
            "tool_use_id",
            "content",
            "is_error",
            "cache_control",
        ],
    )?;
    let id = present(obj, "tool_use_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            AnthropicError::invalid(
                format!("{path}.tool_use_id"),
                "expected the id of the tool_use it answers",
            )
        })?;
    if present(obj, "is_error").is_some_and(|v| !v.is_boolean()) {
        return Err(AnthropicError::invalid(
            format!("{path}.is_error"),
            "expected a boolean",
        ));
    }
    let mut images = Vec::new();
    let text = match present(obj, "content") {
        None => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut texts = Vec::new();
            for (k, block) in blocks.iter().enumerate() {
                let path = format!("{path}.content.{k}");
                let inner = block_object(block, &path)?;
                match block_type(inner, &path)? {
                    "text" => {
                        check_keys(
                            inner,
                            &path,
                            &["type", "text", "cache_control", "citations"],
                        )?;
                        texts.push(text_of(inner, &path)?.to_owned());
                    }
                    "image" => images.push(image_part(inner, &path)?),
                    other => return Err(wrong_block(&path, other, "tool_result", "text, image")),
                }
            }
            texts.join("\n")
        }
        Some(_) => {
            return Err(AnthropicError::invalid(
                format!("{path}.content"),
                "expected a string or a list of text and image blocks",
            ))
        }
    };
    out.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
    if !images.is_empty() {
        out.push(json!({"role": "user", "content": images}));
    }
    Ok(())
}

fn block_object<'a>(
    block: &'a Value,
    path: &str,
) -> Result<&'a Map<String, Value>, AnthropicError> {
    block.as_object().ok_or_else(|| {
        AnthropicError::invalid(path, "expected a content block object with a `type`")
    })
}

fn block_type<'a>(obj: &'a Map<String, Value>, path: &str) -> Result<&'a str, AnthropicError> {
    present(obj, "type").and_then(Value::as_str).ok_or_else(|| {
        AnthropicError::invalid(format!("{path}.type"), "field required: the block's type")
    })
}

fn text_of<'a>(obj: &'a Map<String, Value>, path: &str) -> Result<&'a str, AnthropicError> {
    present(obj, "text")
        .and_then(Value::as_str)
        .ok_or_else(|| AnthropicError::invalid(format!("{path}.text"), "expected a string"))
}

fn wrong_block(path: &str, found: &str, context: &str, allowed: &str) -> AnthropicError {
    AnthropicError::unsupported(
        format!("{path}.type"),
        format!(
            "a `{found}` block is not accepted in {context} content; expected one of: {allowed}"
        ),
    )
}

/// Refuses a key outside `allowed` unless its value is `null` (see `request.rs`).
fn check_keys(
    obj: &Map<String, Value>,
    path: &str,
    allowed: &[&str],
) -> Result<(), AnthropicError> {
    match obj
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        None => Ok(()),
        Some((key, _)) => Err(AnthropicError::unsupported(
            format!("{path}.{key}"),
            format!("unknown field; accepted here: {}", allowed.join(", ")),
        )),
    }
}
