//! llama.cpp's chat preparation (`llama-server --jinja`), read from the llama.cpp that
//! `llama-cpp-python` 0.3.36 vendors (commit 0c1e57098bba): `tools/server/server-common.cpp`
//! `oaicompat_chat_params_parse`, `common/chat.cpp` `common_chat_msgs_parse_oaicompat`,
//! `common_chat_msg::to_json_oaicompat`, `common_chat_tools_parse_oaicompat`,
//! `messages_inp_normalizer`, `common_chat_templates_apply_jinja`,
//! `common_chat_template_direct_apply_impl`, and `common/jinja/caps.cpp` `caps_get`.
//!
//! - messages are parsed into typed structs and re-serialized: `role, content,
//!   [reasoning_content], [name], [tool_call_id], [tool_calls]`, empty strings left out,
//!   null content as `""`; tool-call arguments kept as the client's string, or parsed when
//!   the template reads them as objects;
//! - content parts are joined with `"\n"` for templates that only take string content
//!   (empty parts still add a separator), wrapped for templates that only take parts;
//! - tools are re-serialized as `{type, function: {name, description ("" when absent),
//!   parameters ({} when absent)}}`; `tool_choice` never changes the prompt (`"none"`
//!   keeps the tools);
//! - `enable_thinking` is always a template variable (true when the template has a
//!   reasoning block), `reasoning_effort: "none"` turns it off; `datetime` and
//!   `date_string` hold today's date; `preserve_reasoning` is true;
//! - a trailing assistant message is continued: the rest is rendered without a generation
//!   prompt, and the template's own generation prompt plus the message's text appended;
//! - the prompt is tokenized with special tokens (BOS where the vocabulary adds one, a
//!   template's leading BOS text then removed).
//!
//! - floats in `tojson` print as llama.cpp's own Jinja prints them (6 significant digits:
//!   `1.0` as `1`).
//!
//! Not mirrored (the engine's count differs; the guard sees it): the specialised chat
//! formats (Functionary, Kimi, GPT-OSS, Qwen3-Coder XML, ...); `chat_template_kwargs` that
//! override `messages`, `tools` or `add_generation_prompt` (llama.cpp lets them).

use serde_json::{Map, Value};

pub(crate) use super::llama_caps::Caps;
use super::schema::schema_types;
use super::{
    content_text, refused, ChatRequest, Continuation, Dialect, LlamaContinuation, Normalize,
    Prepared,
};
use crate::TokenizeError;

pub(super) fn prepare(request: &ChatRequest<'_>, caps: &Caps) -> Result<Prepared, TokenizeError> {
    let Value::Array(list) = request.messages else {
        return Err(refused("'messages' is required and must be an array"));
    };
    let mut messages = list
        .iter()
        .map(parse_message)
        .collect::<Result<Vec<_>, _>>()?;
    let tools = parse_tools(request.tools)?;
    match request.field("tool_choice") {
        Some(Value::String(s)) if !["auto", "none", "required"].contains(&s.as_str()) => {
            return Err(refused(format!("Invalid tool_choice: {s}")))
        }
        _ => {}
    }
    let variables = variables(request, caps)?;
    // `oaicompat_chat_params_parse`: the trailing assistant turn is continued.
    let mut add_generation_prompt = match request.field("add_generation_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(refused("add_generation_prompt must be a boolean")),
    };
    let mut continued = match request.field("continue_final_message") {
        Some(Value::Bool(true)) => Some(None),
        Some(Value::String(s)) if s == "content" || s == "reasoning_content" => {
            Some(Some(s.clone()))
        }
        _ => None,
    };
    let role_at = |i: usize| {
        messages
            .get(i)
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
    };
    let n = messages.len();
    if continued.is_none() && n > 0 && role_at(n - 1) == Some("assistant") {
        if n > 1 && role_at(n - 2) == Some("assistant") {
            return Err(refused(
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        continued = Some(None);
        add_generation_prompt = false;
    }
    let continuation = match continued {
        None => Continuation::None,
        Some(kind) => {
            if add_generation_prompt {
                return Err(refused(
                    "Cannot set both add_generation_prompt and continue_final_message to true.",
                ));
            }
            let last = messages.pop().unwrap_or_default();
            if last.get("role").and_then(Value::as_str) == Some("assistant")
                && last.contains_key("tool_calls")
            {
                return Err(refused(
                    "Cannot continue an assistant message that contains tool calls.",
                ));
            }
            continuation(&last, kind.as_deref(), caps)
        }
    };
    let messages = normalize(messages, caps)?;
    Ok(Prepared {
        messages: Value::Array(messages.into_iter().map(Value::Object).collect()),
        tools,
        retry_with_functions: false,
        variables,
        add_generation_prompt,
        continuation,
        normalize: Normalize::AsGiven,
        add_special_tokens: true,
        dialect: Dialect::LlamaCpp,
        media: Vec::new(),
    })
}

/// `common_chat_msgs_parse_oaicompat` + `to_json_oaicompat`: the message as the template
/// sees it.
fn parse_message(message: &Value) -> Result<Map<String, Value>, TokenizeError> {
    let m = message
        .as_object()
        .ok_or_else(|| refused("Failed to parse messages: every message must be an object"))?;
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| refused("Failed to parse messages: Missing 'role' in message"))?;
    if role != "assistant" && !m.contains_key("content") {
        return Err(refused("All non-assistant messages must contain 'content'"));
    }
    if role == "assistant" && !m.contains_key("content") && !m.contains_key("tool_calls") {
        return Err(refused(
            "Assistant message must contain either 'content' or 'tool_calls'!",
        ));
    }
    let content = match m.get("content") {
        None | Some(Value::Null) => Value::from(""),
        Some(Value::String(s)) => Value::from(s.as_str()),
        Some(Value::Array(parts)) => {
            let mut kept = Vec::with_capacity(parts.len());
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = part.get("text").and_then(Value::as_str).ok_or_else(|| {
                            refused("Failed to parse messages: a text part needs a string 'text'")
                        })?;
                        kept.push(serde_json::json!({"type": "text", "text": text}));
                    }
                    Some("image_url" | "input_audio" | "input_video" | "video_url") => {
                        return Err(refused("image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"))
                    }
                    _ => return Err(refused("unsupported content[].type")),
                }
            }
            if kept.is_empty() {
                Value::from("")
            } else {
                Value::Array(kept)
            }
        }
        Some(_) => return Err(refused("Expected 'content' to be a string or an array")),
    };
    let text_field = |key: &str| -> Result<Option<String>, TokenizeError> {
        match m.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone()).filter(|s| !s.is_empty())),
            Some(_) => Err(refused(format!(
                "Failed to parse messages: '{key}' must be a string"
            ))),
        }
    };
    let mut out = Map::new();
    out.insert("role".into(), Value::from(role));
    out.insert("content".into(), content);
    for key in ["reasoning_content", "name", "tool_call_id"] {
        if let Some(v) = text_field(key)? {
            out.insert(key.into(), Value::from(v));
        }
    }
    if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
        let parsed = calls.iter().map(tool_call).collect::<Result<Vec<_>, _>>()?;
        if !parsed.is_empty() {
            out.insert("tool_calls".into(), Value::Array(parsed));
        }
    }
    Ok(out)
}

/// A tool call as re-serialized: `{type, function: {name, arguments (a string)}, [id]}`.
fn tool_call(call: &Value) -> Result<Value, TokenizeError> {
    let fail = |what: &str| refused(format!("Failed to parse messages: {what}"));
    if call.get("type").and_then(Value::as_str) != Some("function") {
        return Err(fail("a tool call needs \"type\": \"function\""));
    }
    let function = call
        .get("function")
        .ok_or_else(|| fail("a tool call needs 'function'"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| fail("a tool call needs 'function.name'"))?;
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => return Err(fail("a tool call needs 'function.arguments'")),
    };
    let mut out = Map::new();
    out.insert("type".into(), Value::from("function"));
    out.insert(
        "function".into(),
        serde_json::json!({"name": name, "arguments": arguments}),
    );
    if let Some(id) = call.get("id").and_then(Value::as_str) {
        out.insert("id".into(), Value::from(id));
    }
    Ok(Value::Object(out))
}

/// `common_chat_tools_parse_oaicompat` + `common_chat_tools_to_json_oaicompat`.
fn parse_tools(tools: Option<&Value>) -> Result<Option<Value>, TokenizeError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => {
            return Err(refused(
                "Failed to parse tools: Expected 'tools' to be an array",
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for tool in list {
        let fail = |what: &str| refused(format!("Failed to parse tools: {what}"));
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(fail("a tool needs \"type\": \"function\""));
        }
        let f = tool
            .get("function")
            .ok_or_else(|| fail("a tool needs 'function'"))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| fail("a tool needs 'function.name'"))?;
        let description = match f.get("description") {
            None => Value::from(""),
            Some(s @ Value::String(_)) => s.clone(),
            Some(_) => return Err(fail("'function.description' must be a string")),
        };
        let parameters = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| Value::Object(Map::new()));
        // The tool-call grammar is built from the schemas; a type it does not know fails it.
        if let Err(why) = schema_types(&parameters, "#") {
            return Err(refused(format!(
                "Unable to generate parser for this template. Automatic parser generation failed: JSON schema error at {why}"
            )));
        }
        out.push(serde_json::json!({"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}));
    }
    Ok((!out.is_empty()).then_some(Value::Array(out)))
}

/// The template variables (`common_chat_template_direct_apply_impl`, the thinking rules of
/// `oaicompat_chat_params_parse`).
fn variables(request: &ChatRequest<'_>, caps: &Caps) -> Result<Map<String, Value>, TokenizeError> {
    let mut kwargs = match request.field("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(refused("chat_template_kwargs must be an object")),
    };
    kwargs
        .entry("preserve_reasoning")
        .or_insert(Value::Bool(true));
    let mut thinking = caps.reasoning_tags.is_some();
    match kwargs.get("enable_thinking") {
        Some(Value::Bool(b)) => thinking = *b,
        Some(Value::String(_)) => {
            return Err(refused(
                "invalid type for \"enable_thinking\" (expected boolean, got string)",
            ))
        }
        _ => {}
    }
    match request.field("reasoning_effort") {
        Some(Value::String(s)) if s == "none" => {
            thinking = false;
            kwargs.shift_remove("reasoning_effort");
        }
        Some(Value::String(s)) if !s.is_empty() => {
            kwargs.insert("reasoning_effort".into(), Value::from(s.as_str()));
        }
        _ => {}
    }
    let mut vars = Map::new();
    vars.insert(crate::pyjson::CPP_FLOATS_VARIABLE.into(), Value::Bool(true));
    vars.insert("enable_thinking".into(), Value::Bool(thinking));
    let (datetime, date) = today();
    vars.insert("datetime".into(), Value::from(datetime));
    vars.insert("date_string".into(), Value::from(date));
    vars.extend(kwargs);
    if let Some(Value::Bool(keep)) = vars.get("preserve_reasoning").cloned() {
        vars.insert("preserve_thinking".into(), Value::Bool(keep));
        for name in [
            "clear_thinking",
            "drop_thinking",
            "truncate_history_thinking",
        ] {
            vars.insert(name.into(), Value::Bool(!keep));
        }
    }
    if let Some(effort) = vars
        .get("reasoning_effort")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        let effort = Value::from(effort);
        vars.insert("reasoning_strength".into(), effort);
    }
    Ok(vars)
}

/// Today as llama.cpp formats it for templates: `("%b %d %Y", "%d %b %Y")` (UTC).
pub(crate) fn today() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    (
        crate::strftime::strftime_utc("%b %d %Y", secs),
        crate::strftime::strftime_utc("%d %b %Y", secs),
    )
}

/// `messages_inp_normalizer` and the workarounds, in llama.cpp's order.
fn normalize(
    messages: Vec<Map<String, Value>>,
    caps: &Caps,
) -> Result<Vec<Map<String, Value>>, TokenizeError> {
    let mut out: Vec<Map<String, Value>> = messages
        .into_iter()
        .map(|mut m| {
            match m.get("content").cloned() {
                Some(Value::Array(parts)) if caps.string_content && !caps.typed_content => {
                    m.insert("content".into(), Value::from(join_parts(&parts)));
                }
                Some(Value::String(s)) if caps.typed_content && !caps.string_content => {
                    m.insert(
                        "content".into(),
                        serde_json::json!([{"type": "text", "text": s}]),
                    );
                }
                _ => {}
            }
            if m.get("role").and_then(Value::as_str) == Some("developer") {
                m.insert("role".into(), Value::from("system"));
            }
            m
        })
        .collect();
    if !caps.system_role
        && out
            .first()
            .and_then(|m| m.get("role"))
            .and_then(Value::as_str)
            == Some("system")
    {
        let first = out.remove(0);
        if let Some(second) = out.first_mut() {
            let text = |m: &Map<String, Value>| {
                m.get("content")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let merged = format!("{}\n{}", text(&first), text(second));
            second.insert("content".into(), Value::from(merged));
        }
    }
    if caps.object_arguments {
        for m in &mut out {
            let Some(Value::Array(calls)) = m.get_mut("tool_calls") else {
                continue;
            };
            for call in calls {
                if let Some(Value::Object(f)) = call.get_mut("function") {
                    if let Some(Value::String(text)) = f.get("arguments") {
                        let parsed: Value = serde_json::from_str(text).map_err(|e| {
                            refused(format!("Failed to parse tool call arguments as JSON: {e}"))
                        })?;
                        f.insert("arguments".into(), parsed);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// `concat_content_parts`: text parts joined with `"\n"` once something was written.
fn join_parts(parts: &[Value]) -> String {
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or_default());
    }
    text
}

/// What continuing `last` appends (`kind`: "content", "reasoning_content" or automatic).
fn continuation(last: &Map<String, Value>, kind: Option<&str>, caps: &Caps) -> Continuation {
    let reasoning = last
        .get("reasoning_content")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    // A continued message's parts are joined with a blank line (`render_content`).
    let content = content_text(last.get("content"), "\n\n");
    let empty = content.is_empty()
        && reasoning.is_empty()
        && !["name", "tool_call_id", "tool_calls"]
            .iter()
            .any(|k| last.contains_key(*k));
    if empty {
        return Continuation::AfterGenerationPrompt(LlamaContinuation {
            reasoning_tags: None,
            reasoning: String::new(),
            content: None,
            empty: true,
        });
    }
    let continue_reasoning = match kind {
        Some("reasoning_content") => true,
        Some(_) => false,
        None => !reasoning.is_empty() && content.is_empty(),
    };
    Continuation::AfterGenerationPrompt(LlamaContinuation {
        reasoning_tags: caps.reasoning_tags.clone(),
        reasoning,
        content: (!continue_reasoning).then_some(content),
        empty: false,
    })
}
