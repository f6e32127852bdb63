//! The chat completions request SGLang builds from an Anthropic `POST /v1/messages` (and
//! `/v1/messages/count_tokens`) body, so kvgate counts the prompt an SGLang engine that
//! serves `/v1/messages` itself will render.
//!
//! SGLang's conversion differs across versions, and in newer ones it depends on the chat
//! template and `--reasoning-parser`. Read for this module (sgl-project/sglang, under
//! `python/sglang/srt/entrypoints/anthropic/`):
//! - the older inline conversion, `serving.py` `_convert_to_chat_completion_request` at
//!   commit 0198d48d21ccf1f0fc0015736b534948295b893b, and its request model `protocol.py`
//!   at 032977b33269eb2154f0df461840301ed8157d43 / 27522b3cee51352753f2a3a793b636d3510b080c;
//! - the newer `request_conversion.py` `convert_anthropic_to_openai_request` at commit
//!   bef8e23885ea40a1c246143e5a699b484ef04c64 (with the callbacks `merge_inline_system`,
//!   `wrap_reasoning_history`, `apply_reasoning_enabled`), called by `serving.py` at the
//!   same commit.
//!
//! Only the subset on which those agree is converted; the rest is refused, never guessed:
//! [`AnthropicChatError::Invalid`] where SGLang itself answers 400 (its request model or
//! conversion raises), [`AnthropicChatError::Unsupported`] where SGLang would accept the
//! request but how it becomes a prompt depends on its version or flags (or kvgate does not
//! model it), each naming the field's path and why. Stricter than SGLang on purpose:
//! unknown fields, which SGLang's request models ignore, are refused too.
//!
//! The messages and their content blocks are converted in `anthropic_blocks.rs`.

use serde_json::{json, Map, Value};

use super::anthropic_blocks::{convert_message, text_blocks};
pub use super::anthropic_fields::AnthropicChatError;
use super::anthropic_fields::{
    field, invalid, join, only_keys, unsupported, wrong_type, Converted,
};

/// The fields of `AnthropicMessagesRequest` kvgate converts.
const MESSAGES_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "metadata",
    "stop_sequences",
    "stream",
    "system",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
];

/// The fields of `AnthropicCountTokensRequest` kvgate converts.
const COUNT_FIELDS: &[&str] = &["model", "messages", "system", "tools", "tool_choice"];

/// Fields SGLang knows in some versions only, or handles by its flags.
const VERSION_DEPENDENT: &[(&str, &str)] = &[
    ("thinking", "older SGLang ignores it; newer turns it into chat_template_kwargs through the --reasoning-parser, so the prompt depends on the version and the server's flags"),
    ("output_config", "newer SGLang maps its effort to reasoning_effort (a template variable), older ignores it"),
    ("betas", "newer SGLang accepts and logs it, older ignores it; kvgate does not model beta features"),
    ("service_tier", "not part of SGLang's request model; kvgate does not guess how an engine treats it"),
    ("container", "a server-side container has no equivalent in SGLang"),
    ("mcp_servers", "MCP connectors have no equivalent in SGLang"),
    ("context_management", "context management has no equivalent in SGLang"),
];

/// `POST /v1/messages` → the chat completions body SGLang builds (as a JSON object).
pub fn sglang_messages_chat(
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, AnthropicChatError> {
    convert(body, false)
}

/// `POST /v1/messages/count_tokens` → the same with `max_tokens` 1 and no stream (SGLang's
/// `handle_count_tokens` builds an `AnthropicMessagesRequest` with `max_tokens=1` from the
/// count request's model, messages, system, tools and tool_choice and runs the same
/// conversion).
pub fn sglang_count_tokens_chat(
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, AnthropicChatError> {
    convert(body, true)
}

fn convert(body: &Map<String, Value>, count: bool) -> Converted<Map<String, Value>> {
    for (key, why) in VERSION_DEPENDENT {
        if field(body, key).is_some() {
            return Err(unsupported(key, *why));
        }
    }
    // The version-dependent fields left are null: unset in every version.
    let mut allowed: Vec<&str> = VERSION_DEPENDENT.iter().map(|(key, _)| *key).collect();
    allowed.extend_from_slice(if count { COUNT_FIELDS } else { MESSAGES_FIELDS });
    only_keys(body, &allowed, "")?;
    let model = match body.get("model") {
        None | Some(Value::Null) => return Err(invalid("model", "Field required")),
        Some(Value::String(s)) if s.is_empty() => {
            return Err(invalid("model", "Model is required"))
        }
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(wrong_type("model", "a string")),
    };
    let max_tokens = if count { json!(1) } else { max_tokens(body)? };
    let stream = match field(body, "stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(wrong_type("stream", "a boolean")),
    };
    if let Some(metadata) = field(body, "metadata") {
        if !metadata.is_object() {
            return Err(wrong_type("metadata", "an object"));
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = system(field(body, "system"))? {
        messages.push(json!({"role": "system", "content": system}));
    }
    let list = match body.get("messages") {
        None | Some(Value::Null) => return Err(invalid("messages", "Field required")),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("messages", "Input should be a valid list")),
    };
    for (i, message) in list.iter().enumerate() {
        convert_message(&format!("messages[{i}]"), message, &mut messages)?;
    }
    let tools = tools(field(body, "tools"))?;
    let tool_choice = tool_choice(field(body, "tool_choice"), &tools)?;

    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    chat.insert("model".into(), Value::String(model));
    chat.insert("max_tokens".into(), max_tokens);
    chat.insert("stream".into(), Value::Bool(stream));
    for key in ["temperature", "top_p"] {
        match field(body, key) {
            None => {}
            Some(v @ Value::Number(_)) => {
                chat.insert(key.into(), v.clone());
            }
            Some(_) => return Err(wrong_type(key, "a number")),
        }
    }
    match field(body, "top_k") {
        None => {}
        Some(v) if v.is_i64() || v.is_u64() => {
            chat.insert("top_k".into(), v.clone());
        }
        Some(_) => return Err(wrong_type("top_k", "an integer")),
    }
    if let Some(stop) = field(body, "stop_sequences") {
        let strings = stop
            .as_array()
            .is_some_and(|l| l.iter().all(Value::is_string));
        if !strings {
            return Err(wrong_type("stop_sequences", "a list of strings"));
        }
        chat.insert("stop".into(), stop.clone());
    }
    if stream {
        chat.insert(
            "stream_options".into(),
            json!({"include_usage": true, "continuous_usage_stats": true}),
        );
    }
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = tool_choice {
        chat.insert("tool_choice".into(), choice);
    }
    Ok(chat)
}

/// `max_tokens`: required, an integer, positive (`validate_max_tokens`).
fn max_tokens(body: &Map<String, Value>) -> Converted<Value> {
    match body.get("max_tokens") {
        None | Some(Value::Null) => Err(invalid("max_tokens", "Field required")),
        Some(v) if v.as_i64().is_some_and(|n| n <= 0) => {
            Err(invalid("max_tokens", "max_tokens must be positive"))
        }
        Some(v) if v.is_i64() || v.is_u64() => Ok(v.clone()),
        Some(_) => Err(wrong_type("max_tokens", "an integer")),
    }
}

/// The system message's text, if any. A string: itself when not empty (both versions skip
/// ""; only newer skips a whitespace-only one). Text blocks: the non-empty texts joined
/// with "\n" (older adds an empty system message when a non-empty list has no text, newer
/// adds none).
fn system(system: Option<&Value>) -> Converted<Option<String>> {
    match system {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => Err(unsupported(
            "system",
            "a whitespace-only system prompt: older SGLang sends it as the system message, newer drops it",
        )),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(blocks)) if blocks.is_empty() => Ok(None),
        Some(Value::Array(blocks)) => {
            let texts = text_blocks(blocks, "system")?;
            if texts.is_empty() {
                return Err(unsupported(
                    "system",
                    "system blocks without any text: older SGLang sends an empty system message, newer none",
                ));
            }
            Ok(Some(texts.join("\n")))
        }
        Some(_) => Err(invalid("system", "Input should be a valid string or list")),
    }
}

/// Anthropic's server tools (a `type` other than `custom`) that kvgate names in its refusal.
fn server_tool_reason(kind: &str) -> String {
    format!(
        "the server tool type {kind:?}: older SGLang refuses it (no input_schema), newer drops it from the tools; kvgate converts custom tools only"
    )
}

/// `tools` → the chat's function tools.
fn tools(tools: Option<&Value>) -> Converted<Vec<Value>> {
    let Some(tools) = tools else {
        return Ok(Vec::new());
    };
    let Some(list) = tools.as_array() else {
        return Err(invalid("tools", "Input should be a valid list"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let path = format!("tools[{i}]");
        let Some(tool) = tool.as_object() else {
            return Err(invalid(&path, "Input should be a valid dictionary"));
        };
        match field(tool, "type") {
            None => {}
            Some(Value::String(kind)) if kind == "custom" => {}
            Some(Value::String(kind)) => {
                return Err(unsupported(&join(&path, "type"), server_tool_reason(kind)))
            }
            Some(_) => return Err(wrong_type(&join(&path, "type"), "a string")),
        }
        if tool
            .get("defer_loading")
            .is_some_and(|v| v != &Value::Bool(false) && !v.is_null())
        {
            return Err(unsupported(
                &join(&path, "defer_loading"),
                "deferred tools: newer SGLang keeps them for the chat template to hide or show, older drops the flag",
            ));
        }
        only_keys(
            tool,
            &[
                "type",
                "name",
                "description",
                "input_schema",
                "cache_control",
                "defer_loading",
            ],
            &path,
        )?;
        let name = match tool.get("name") {
            Some(Value::String(name)) => name.clone(),
            None | Some(Value::Null) => {
                return Err(invalid(&join(&path, "name"), "Field required"))
            }
            Some(_) => return Err(wrong_type(&join(&path, "name"), "a string")),
        };
        let description = match field(tool, "description") {
            None => String::new(),
            Some(Value::String(d)) => d.clone(),
            Some(_) => return Err(wrong_type(&join(&path, "description"), "a string")),
        };
        let schema_path = join(&path, "input_schema");
        let schema = match tool.get("input_schema") {
            Some(Value::Object(schema)) => schema,
            None | Some(Value::Null) => return Err(invalid(&schema_path, "Field required")),
            Some(_) => return Err(invalid(&schema_path, "input_schema must be a dictionary")),
        };
        match schema.get("type") {
            Some(Value::String(t)) if t == "object" => {}
            None => {
                return Err(unsupported(
                    &join(&schema_path, "type"),
                    "an input_schema without type: SGLang versions differ in adding \"type\": \"object\"",
                ))
            }
            Some(_) => {
                return Err(unsupported(
                    &join(&schema_path, "type"),
                    "an input_schema whose type is not \"object\" (Anthropic requires it; kvgate does not model others)",
                ))
            }
        }
        out.push(json!({"type": "function", "function": {
            "name": name, "description": description, "parameters": Value::Object(schema.clone()),
        }}));
    }
    Ok(out)
}

/// `tool_choice` → the chat's `tool_choice` (None: the chat's default).
fn tool_choice(choice: Option<&Value>, tools: &[Value]) -> Converted<Option<Value>> {
    let Some(choice) = choice else {
        return Ok((!tools.is_empty()).then(|| json!("auto")));
    };
    let Some(choice) = choice.as_object() else {
        return Err(invalid("tool_choice", "Input should be a valid dictionary"));
    };
    if field(choice, "disable_parallel_tool_use").is_some() {
        return Err(unsupported(
            "tool_choice.disable_parallel_tool_use",
            "SGLang ignores it; kvgate does not pass a generation constraint the engine drops",
        ));
    }
    only_keys(
        choice,
        &["type", "name", "disable_parallel_tool_use"],
        "tool_choice",
    )?;
    let kind = choice
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let out = match kind {
        "none" => json!("none"),
        "auto" if tools.is_empty() => return Ok(None),
        "auto" => json!("auto"),
        "any" | "tool" if tools.is_empty() => {
            return Err(invalid(
                "tool_choice.type",
                format!("tool_choice={kind:?} requires at least one custom tool"),
            ))
        }
        "any" => json!("required"),
        "tool" => {
            let name = match choice.get("name") {
                Some(Value::String(name)) => name,
                _ => {
                    return Err(invalid(
                        "tool_choice.name",
                        "tool_choice \"tool\" needs the tool's name",
                    ))
                }
            };
            let known = tools.iter().any(|t| t["function"]["name"] == *name);
            if !known {
                return Err(invalid(
                    "tool_choice.name",
                    format!("tool_choice references tool {name:?} but it is not in the tools list"),
                ));
            }
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(invalid(
                "tool_choice.type",
                "Input should be 'auto', 'any', 'tool' or 'none'",
            ))
        }
    };
    Ok(Some(out))
}

#[cfg(test)]
#[path = "anthropic_tests.rs"]
mod tests;
