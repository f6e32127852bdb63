//! SGLang's chat preparation (`/v1/chat/completions` with the model's HF template), read
//! from sglang 0.5.23 (`python/sglang/srt/entrypoints/openai/serving_chat.py`,
//! `protocol.py`, `parser/jinja_template_utils.py`; transformers 5.19.0 as it pins).
//!
//! The steps, in SGLang's order (each names the function it follows):
//! 1. the request model: roles, message and part dumps (`protocol.py`
//!    `ChatCompletionMessageUserParam` / `ChatCompletionMessageGenericParam`, `ToolCall`);
//! 2. `normalize_reasoning_inputs`: `reasoning_effort` (or `reasoning.effort`) sets the
//!    `thinking` / `enable_thinking` template variables unless the client did;
//! 3. `_convert_to_internal_request`: `chat_template_kwargs.reasoning_effort` overrides
//!    the top-level field;
//! 4. `_validate_request` and `set_tool_choice_default` (`tools::check`);
//! 5. `_process_messages`: which tools reach the template (`tools::selected`);
//! 6. `normalize_assistant_tool_call_arguments`: string arguments parsed to objects;
//! 7. `process_content_for_template_format` + `normalize_tool_content`: null content is
//!    `""`, parts joined with one space for "string" templates, top-level nulls dropped;
//! 8. `_handle_last_assistant_message`: a trailing assistant turn becomes a user turn, or
//!    with `continue_final_message` is removed and its text appended as separately encoded
//!    tokens;
//! 9. `_apply_jinja_template`: `reasoning_effort` and `chat_template_kwargs` as template
//!    variables, `add_generation_prompt = true`, a retry with bare function tools.

use serde_json::{Map, Value};

use super::content_format::ContentFormat;
use super::media::{self, MediaKind, MediaPart, ModelInput};
use super::tools;
use super::{refused, ChatRequest, Continuation, Dialect, Normalize, Prepared};
use crate::TokenizeError;

/// Roles of `ChatCompletionMessageGenericParam` (lower-cased by `_normalize_role`).
const GENERIC_ROLES: [&str; 7] = [
    "system",
    "assistant",
    "tool",
    "function",
    "developer",
    "latest_reminder",
    "root",
];

/// `ReasoningEffortType`'s tiers.
pub(super) const EFFORT_TIERS: [&str; 8] = [
    "none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max",
];

/// `apply_chat_template`'s own parameters: a template variable of that name is a
/// `TypeError` ("got multiple values for keyword argument").
const TEMPLATE_PARAMETERS: [&str; 5] = [
    "conversation",
    "tools",
    "add_generation_prompt",
    "tokenize",
    "return_dict",
];

/// Prepare `request` as SGLang does for a template of content format `format` and a model
/// that takes `input`.
pub(super) fn prepare(
    request: &ChatRequest<'_>,
    format: ContentFormat,
    input: ModelInput,
) -> Result<Prepared, TokenizeError> {
    let list = request
        .messages
        .as_array()
        .ok_or_else(|| refused("messages must be a list of message objects"))?;
    let mut messages = list
        .iter()
        .enumerate()
        .map(|(i, m)| dump_message(i, m, input))
        .collect::<Result<Vec<_>, _>>()?;
    let mut kwargs = template_kwargs(request)?;
    // `_validate_request`: checks in SGLang's order.
    if messages.is_empty() {
        return Err(refused("Messages cannot be empty."));
    }
    if kwargs.contains_key("chat_template") {
        return Err(refused("Request-supplied chat_template is not allowed. Start the server with --trust-request-chat-template to permit it."));
    }
    let client_tools = tools::dump_list(request.tools)?;
    let choice = tools::choice(
        request.field("tool_choice"),
        client_tools.as_ref(),
        &messages,
    )?;
    tools::check(&choice, client_tools.as_ref(), &mut messages)?;
    let selected = tools::selected(&choice, client_tools);
    for message in &mut messages {
        parse_tool_call_arguments(message)?;
    }
    let mut media = Vec::new();
    let mut out: Vec<Map<String, Value>> = messages
        .into_iter()
        .map(|m| for_template(m, format, &mut media))
        .collect();
    let continuation = last_assistant(&mut out, request.continue_final_message()?);
    let effort = kwargs
        .shift_remove("reasoning_effort")
        .filter(|v| !v.is_null());
    let mut variables = Map::new();
    if let Some(effort) = effort.or(reasoning_effort(request)?) {
        variables.insert("reasoning_effort".into(), effort);
    }
    for name in TEMPLATE_PARAMETERS {
        if kwargs.contains_key(name) {
            return Err(refused(format!(
                "apply_chat_template() got multiple values for keyword argument '{name}'"
            )));
        }
    }
    if kwargs.get("continue_final_message").is_some_and(is_truthy) {
        return Err(refused("continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead."));
    }
    kwargs.shift_remove("continue_final_message");
    variables.extend(kwargs);
    Ok(Prepared {
        messages: Value::Array(out.into_iter().map(Value::Object).collect()),
        tools: selected.map(Value::Array),
        retry_with_functions: true,
        variables,
        add_generation_prompt: true,
        continuation,
        normalize: Normalize::AsGiven,
        add_special_tokens: false,
        dialect: Dialect::Jinja2,
        media,
    })
}

/// `chat_template_kwargs` after `normalize_reasoning_inputs`: the client's, plus
/// `thinking` and `enable_thinking` derived from the reasoning inputs where it set neither.
fn template_kwargs(request: &ChatRequest<'_>) -> Result<Map<String, Value>, TokenizeError> {
    let mut kwargs = match request.field("chat_template_kwargs") {
        Some(Value::Object(map)) => map.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err(refused("chat_template_kwargs must be an object")),
    };
    let mut thinking: Option<bool> = None;
    if let Some(Value::Object(reasoning)) = request.field("reasoning") {
        let enabled = reasoning
            .get("enabled")
            .filter(|v| !v.is_null())
            .or_else(|| reasoning.get("enable"))
            .is_some_and(is_truthy);
        if enabled {
            thinking = Some(true);
        }
    }
    if let Some(effort) = reasoning_effort(request)? {
        thinking = Some(effort.as_str() != Some("none"));
    }
    if let Some(on) = thinking {
        kwargs.entry("thinking").or_insert(Value::Bool(on));
        kwargs.entry("enable_thinking").or_insert(Value::Bool(on));
    }
    Ok(kwargs)
}

/// The request's reasoning effort (`reasoning_effort`, else `reasoning.effort`), as
/// `ReasoningEffortType` validates it: a tier name or a number in [0, 0.99].
fn reasoning_effort(request: &ChatRequest<'_>) -> Result<Option<Value>, TokenizeError> {
    let nested = match request.field("reasoning") {
        Some(Value::Object(r)) => r
            .get("effort")
            .filter(|v| !v.is_null())
            .or_else(|| r.get("reasoning_effort")),
        _ => None,
    };
    // `normalize_reasoning_inputs` copies `reasoning.effort` over the top-level field.
    let value = match nested.filter(|v| !v.is_null()) {
        Some(v) => v,
        None => match request.field("reasoning_effort").filter(|v| !v.is_null()) {
            Some(v) => v,
            None => return Ok(None),
        },
    };
    let number = |x: f64| {
        (0.0..=0.99)
            .contains(&x)
            .then(|| Value::from(x))
            .ok_or_else(|| refused(format!("invalid reasoning effort: {x}")))
    };
    match value {
        Value::String(s) if EFFORT_TIERS.contains(&s.as_str()) => Ok(Some(value.clone())),
        Value::String(s) => match s.trim().parse::<f64>() {
            Ok(x) => number(x).map(Some),
            Err(_) => Err(refused(format!("invalid reasoning effort: {s}"))),
        },
        Value::Number(n) => number(n.as_f64().unwrap_or(f64::NAN)).map(Some),
        other => Err(refused(format!("invalid reasoning effort: {other}"))),
    }
}

/// Python truthiness of a JSON value as SGLang reads flags (`"1"`, `"true"`, `"yes"`,
/// `"y"`, `"on"` for strings).
fn is_truthy(value: &Value) -> bool {
    match value {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => matches!(
            s.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "y" | "on"
        ),
        _ => false,
    }
}

/// A message as the request model dumps it (`model_dump()`): the user model keeps `role`
/// and `content`; the generic one every field in its declared order (nulls included);
/// unknown keys are ignored.
fn dump_message(
    i: usize,
    message: &Value,
    input: ModelInput,
) -> Result<Map<String, Value>, TokenizeError> {
    let invalid = |what: &str| refused(format!("messages[{i}]: {what}"));
    let Value::Object(m) = message else {
        return Err(invalid("must be an object"));
    };
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("`role` must be a string"))?;
    let mut out = Map::new();
    if role == "user" {
        let content = match m.get("content") {
            Some(c @ (Value::String(_) | Value::Array(_))) => dump_content(i, c, false, input)?,
            _ => {
                return Err(invalid(
                    "a user message needs `content`: a string or a list of content parts",
                ))
            }
        };
        out.insert("role".into(), Value::from("user"));
        out.insert("content".into(), content);
        return Ok(out);
    }
    let lower = role.to_lowercase();
    if !GENERIC_ROLES.contains(&lower.as_str()) {
        return Err(invalid(&format!(
            "unknown role `{role}` (one of user, {})",
            GENERIC_ROLES.join(", ")
        )));
    }
    out.insert("role".into(), Value::from(lower.as_str()));
    let content = match m.get("content") {
        None | Some(Value::Null) => Value::Null,
        Some(c @ (Value::String(_) | Value::Array(_))) => {
            dump_content(i, c, lower == "assistant", input)?
        }
        Some(_) => {
            return Err(invalid(
                "`content` must be a string, a list of parts or null",
            ))
        }
    };
    out.insert("content".into(), content);
    for key in ["tool_call_id", "name", "phase", "reasoning_content"] {
        let value = match m.get(key) {
            None | Some(Value::Null) => Value::Null,
            Some(s @ Value::String(_)) => s.clone(),
            Some(_) => return Err(invalid(&format!("`{key}` must be a string"))),
        };
        out.insert(key.into(), value);
    }
    let tool_calls = match m.get("tool_calls") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Array(calls)) => Value::Array(
            calls
                .iter()
                .map(|c| tools::dump_call(c).map_err(|e| invalid(&e)))
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(invalid("`tool_calls` must be a list")),
    };
    out.insert("tool_calls".into(), tool_calls);
    let tools = match tools::dump_list(m.get("tools"))? {
        Some(list) => Value::Array(list.into_iter().map(Value::Object).collect()),
        None => Value::Null,
    };
    out.insert("tools".into(), tools);
    let prefix = match m.get("prefix") {
        None | Some(Value::Null) => Value::Null,
        Some(b @ Value::Bool(_)) => b.clone(),
        Some(_) => return Err(invalid("`prefix` must be a boolean")),
    };
    out.insert("prefix".into(), prefix);
    Ok(out)
}

/// A content value as dumped: strings as they are, text parts as `{type, text}`, thinking
/// parts (assistant turns only: `validate_thinking_parts_role`) as they are, media parts
/// as [`media::dump_part`] checks them (refused for a text-only model).
fn dump_content(
    i: usize,
    content: &Value,
    assistant: bool,
    input: ModelInput,
) -> Result<Value, TokenizeError> {
    let Value::Array(parts) = content else {
        return Ok(content.clone());
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        let text = part.get("text").and_then(Value::as_str);
        if let Some(media_kind) = kind.and_then(MediaKind::of_part_type) {
            out.push(media::dump_part(i, j, media_kind, part, input)?);
            continue;
        }
        match (kind, text) {
            (Some("text"), Some(text)) => {
                let mut p = Map::new();
                p.insert("type".into(), Value::from("text"));
                p.insert("text".into(), Value::from(text));
                out.push(Value::Object(p));
            }
            (Some(kind @ ("thinking" | "reasoning")), _) => {
                if !assistant {
                    return Err(refused(format!(
                        "messages[{i}].content[{j}]: {kind} parts are only allowed in assistant messages"
                    )));
                }
                out.push(part.clone());
            }
            (Some(kind @ "input_audio"), _) => return Err(media::text_only_refusal(kind)),
            _ => {
                return Err(refused(format!(
                    "messages[{i}].content[{j}]: a content part must be {{\"type\": \"text\", \"text\": ...}}"
                )))
            }
        }
    }
    Ok(Value::Array(out))
}

/// `normalize_assistant_tool_call_arguments(strict=True)`: an assistant's string
/// arguments are parsed to a JSON object (the template then re-serializes them).
fn parse_tool_call_arguments(message: &mut Map<String, Value>) -> Result<(), TokenizeError> {
    if message.get("role").and_then(Value::as_str) != Some("assistant") {
        return Ok(());
    }
    let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
        return Ok(());
    };
    for call in calls {
        let Some(Value::Object(function)) = call.get_mut("function") else {
            continue;
        };
        if let Some(Value::String(text)) = function.get("arguments") {
            let parsed: Value = serde_json::from_str(text).map_err(|_| {
                refused("Assistant tool call function.arguments must be valid JSON.")
            })?;
            if !parsed.is_object() {
                return Err(refused(
                    "Assistant tool call function.arguments must be a JSON object.",
                ));
            }
            function.insert("arguments".into(), parsed);
        }
    }
    Ok(())
}

/// `process_content_for_template_format` and `normalize_tool_content`: null content is
/// `""`; lists are joined with one space ("string" templates, media dropped) or kept as
/// text and media placeholder parts ("openai", content then moves last; each media item
/// pushed to `media`); top-level nulls are dropped.
fn for_template(
    mut message: Map<String, Value>,
    format: ContentFormat,
    media: &mut Vec<MediaPart>,
) -> Map<String, Value> {
    if message.get("content").is_none_or(Value::is_null) {
        message.insert("content".into(), Value::from(""));
    }
    let is_tool = message.get("role").and_then(Value::as_str) == Some("tool");
    let mut out = match message.get("content") {
        Some(Value::Array(parts)) => match format {
            ContentFormat::String => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                let joined = Value::from(texts.join(" "));
                message.insert("content".into(), joined);
                message
            }
            ContentFormat::OpenAi => {
                // Thinking parts are dropped; text parts kept; media parts become placeholders.
                let parts = Value::Array(
                    parts
                        .iter()
                        .filter_map(|p| media::template_part(p, media))
                        .collect(),
                );
                let mut moved: Map<String, Value> = message
                    .into_iter()
                    .filter(|(k, _)| k != "content")
                    .collect();
                moved.insert("content".into(), parts);
                moved
            }
        },
        _ => message,
    };
    out.retain(|_, v| !v.is_null());
    if is_tool {
        if let Some(Value::Array(parts)) = out.get("content") {
            let all_text = parts
                .iter()
                .all(|p| p.is_string() || p.get("type").and_then(Value::as_str) == Some("text"));
            if all_text {
                let texts: Vec<String> = parts
                    .iter()
                    .map(|p| match p {
                        Value::String(s) => s.clone(),
                        _ => p
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    })
                    .collect();
                out.insert("content".into(), Value::from(texts.join(" ")));
            }
        }
    }
    out
}

/// `_handle_last_assistant_message`: a final assistant turn with string content becomes a
/// user turn, or (`continue_final_message`) is removed and its text continued.
fn last_assistant(out: &mut Vec<Map<String, Value>>, continue_final: bool) -> Continuation {
    let Some(last) = out.last() else {
        return Continuation::None;
    };
    let is_assistant = last.get("role").and_then(Value::as_str) == Some("assistant");
    let Some(Value::String(text)) = last.get("content").filter(|_| is_assistant) else {
        return Continuation::None;
    };
    let text = text.clone();
    if continue_final {
        out.pop();
        return if text.is_empty() {
            Continuation::None
        } else {
            Continuation::AppendEncoded(text)
        };
    }
    let mut user = Map::new();
    user.insert("role".into(), Value::from("user"));
    user.insert("content".into(), Value::from(text));
    if let Some(last) = out.last_mut() {
        *last = user;
    }
    Continuation::None
}
