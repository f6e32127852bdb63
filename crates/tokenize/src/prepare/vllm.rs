//! vLLM's chat preparation, read from vLLM 0.34.0 (commit 62d4bc3c7; transformers 5.22 as
//! it allows): the HF renderer path used for Qwen3, DeepSeek-V3, Llama and Gemma.
//!
//! The steps, in vLLM's order (each names the function it follows):
//! 1. `chat_completion/protocol.py` `ChatCompletionRequest` validators:
//!    `_normalize_messages_before` (`reasoning_content` is renamed `reasoning`),
//!    `check_generation_prompt`, `check_tool_usage` (`tools: []` is no tools; the
//!    `tool_choice` default and checks);
//! 2. `renderers/online_renderer.py` `render_chat`: the tools dumped
//!    (`ChatCompletionToolsParam.model_dump()`: `description` and `parameters` null when
//!    absent); `tool_choice: "none"` keeps them (`--exclude-tools-when-tool-choice-none` is off
//!    by default);
//! 3. `protocol.py` `build_chat_params` / `params.py` `merge_kwargs`: template variables from
//!    `chat_template_kwargs`, overridden by the top-level `add_generation_prompt`,
//!    `continue_final_message` and `reasoning_effort` (which also sets `enable_thinking`);
//!    `null` and `"auto"` values dropped;
//! 4. `renderers/chat_utils/chat_message.py` `parse_chat_message_content`: each message
//!    rebuilt (`role, content, [tool_calls], [reasoning, reasoning_content] | [tool_call_id],
//!    [name], [tools]`), text parts joined with `"\n"` for "string" templates (empty ones
//!    skipped), `_postprocess_messages` (tool-call arguments parsed to objects, `{}` when
//!    they are not a JSON object);
//! 5. `renderers/hf.py` `safe_apply_chat_template`: `developer` turns become `system` (and
//!    all system turns merge) for templates that do not know the role; then transformers'
//!    `apply_chat_template` (reasoning fields aliased, nulls kept, `continue_final_message`
//!    cut at its tag);
//! 6. `renderers/base.py` `_tokenize_prompt`: the render encoded with the request's
//!    `add_special_tokens` (default false).
//!
//! Server flags kvgate cannot see are taken at their defaults, except that tool calling is
//! assumed enabled (`--enable-auto-tool-choice --tool-call-parser`): without them vLLM
//! refuses any request with tools, which the response guard then reports.

use serde_json::{Map, Value};

use super::content_format::ContentFormat;
use super::vllm_tools::tool_usage;
use super::{content_text, refused, ChatRequest, Continuation, Dialect, Normalize, Prepared};
use crate::TokenizeError;

/// transformers' marker for `continue_final_message` (`render_jinja_template`).
pub(crate) const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG";

/// `reasoning_effort` values the request model accepts.
const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

pub(super) fn prepare(
    request: &ChatRequest<'_>,
    format: ContentFormat,
    template_mentions_developer: bool,
) -> Result<Prepared, TokenizeError> {
    let flag = |name: &str| -> Result<Option<bool>, TokenizeError> {
        match request.field(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(refused(format!("`{name}` must be a boolean"))),
        }
    };
    let continue_final = flag("continue_final_message")?.unwrap_or(false);
    let add_generation_prompt = flag("add_generation_prompt")?.unwrap_or(true);
    if continue_final && flag("add_generation_prompt")? == Some(true) {
        return Err(refused(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    let tools = tool_usage(request)?;
    let Value::Array(list) = request.messages else {
        return Err(refused("messages must be a list of message objects"));
    };
    let mut messages = list
        .iter()
        .map(|m| parse_message(m, format))
        .collect::<Result<Vec<_>, _>>()?;
    postprocess_tool_calls(&mut messages)?;
    if !template_mentions_developer
        && messages
            .iter()
            .any(|m| m.get("role").and_then(Value::as_str) == Some("developer"))
    {
        messages = developer_as_system(messages);
    }
    let mut variables = template_variables(request)?;
    // Top-level fields beat the kwargs (`merge_kwargs`); both are template variables.
    let tools = match variables.shift_remove("tools") {
        Some(Value::Array(t)) => Some(Value::Array(t)),
        _ => tools,
    };
    if variables.contains_key("chat_template") {
        return Err(refused("Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template."));
    }
    for name in [
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
    ] {
        variables.shift_remove(name);
    }
    if continue_final && add_generation_prompt {
        return Err(refused("continue_final_message and add_generation_prompt are not compatible. Use continue_final_message when you want the model to continue the final message, and add_generation_prompt when you want to add a header that will prompt it to start a new assistant message instead."));
    }
    let continuation = if continue_final {
        tag_final_message(&mut messages)?;
        Continuation::CutAtTag
    } else {
        Continuation::None
    };
    let special = flag("add_special_tokens")?.unwrap_or(false);
    Ok(Prepared {
        messages: Value::Array(messages.into_iter().map(Value::Object).collect()),
        tools,
        retry_with_functions: false,
        variables,
        add_generation_prompt,
        continuation,
        normalize: Normalize::AliasReasoning,
        add_special_tokens: special,
        dialect: Dialect::Jinja2,
        media: Vec::new(),
    })
}

/// The template variables (`build_chat_params`, `merge_kwargs`).
fn template_variables(request: &ChatRequest<'_>) -> Result<Map<String, Value>, TokenizeError> {
    let client = match request.field("chat_template_kwargs") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(_) => return Err(refused("chat_template_kwargs must be an object")),
    };
    let effort = match request.field("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if EFFORTS.contains(&s.as_str()) => Some(s.clone()),
        Some(other) => {
            return Err(refused(format!(
                "Invalid value for `reasoning_effort`: {other} (one of {})",
                EFFORTS.join(", ")
            )))
        }
    };
    let mut variables: Map<String, Value> = client
        .into_iter()
        .filter(|(_, v)| !v.is_null() && v.as_str() != Some("auto"))
        .collect();
    if let Some(effort) = effort {
        if !variables.contains_key("enable_thinking") {
            variables.insert("enable_thinking".into(), Value::Bool(effort != "none"));
        }
        variables.insert("reasoning_effort".into(), Value::from(effort));
    }
    Ok(variables)
}

/// `parse_chat_message_content`: one message rebuilt for the template.
fn parse_message(
    message: &Value,
    format: ContentFormat,
) -> Result<Map<String, Value>, TokenizeError> {
    let m = message
        .as_object()
        .ok_or_else(|| refused("every message must be an object"))?;
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| refused("every message needs a string `role`"))?;
    // `_normalize_messages_before`: `reasoning_content` is `reasoning` unless that is set.
    let reasoning = m
        .get("reasoning")
        .filter(|v| !v.is_null())
        .or_else(|| m.get("reasoning_content").filter(|v| !v.is_null()));
    let parts: Vec<Value> = match m.get("content") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![text_part(s)],
        Some(Value::Array(parts)) => parts.clone(),
        Some(_) => {
            return Err(refused(
                "`content` must be a string, a list of parts or null",
            ))
        }
    };
    let mut out = Map::new();
    out.insert("role".into(), Value::from(role));
    out.insert("content".into(), content(&parts, format)?);
    match role {
        "assistant" => {
            if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
                out.insert("tool_calls".into(), calls.clone());
            }
            if let Some(r) = reasoning {
                out.insert("reasoning".into(), r.clone());
                out.insert("reasoning_content".into(), r.clone());
            }
        }
        "tool" => {
            if let Some(id) = m.get("tool_call_id") {
                out.insert("tool_call_id".into(), id.clone());
            }
            if let Some(Value::Array(parts)) = out.get("content") {
                let all_text = parts
                    .iter()
                    .all(|p| p.get("type").and_then(Value::as_str) == Some("text"));
                if all_text {
                    let joined: Vec<&str> = parts
                        .iter()
                        .map(|p| p.get("text").and_then(Value::as_str).unwrap_or_default())
                        .collect();
                    out.insert("content".into(), Value::from(joined.join("\n")));
                }
            }
        }
        _ => {}
    }
    if let Some(name) = m.get("name").filter(|v| v.is_string()) {
        out.insert("name".into(), name.clone());
    }
    if let Some(task) = m.get("task").filter(|v| v.is_string()) {
        out.insert("task".into(), task.clone());
    }
    if role == "developer" {
        out.insert(
            "tools".into(),
            m.get("tools").cloned().unwrap_or(Value::Null),
        );
    }
    Ok(out)
}

fn text_part(text: &str) -> Value {
    let mut p = Map::new();
    p.insert("type".into(), Value::from("text"));
    p.insert("text".into(), Value::from(text));
    Value::Object(p)
}

/// The text of a text-like part (`text`, `input_text`, `output_text`, `refusal`,
/// `thinking`); an error for media and unknown parts.
fn part_text(part: &Value) -> Result<Option<&str>, TokenizeError> {
    if let Value::String(s) = part {
        return Ok(Some(s));
    }
    let field = match part.get("type").and_then(Value::as_str) {
        Some("text" | "input_text" | "output_text") => "text",
        Some("refusal") => "refusal",
        Some("thinking") => "thinking",
        Some(other) => {
            return Err(refused(format!(
                "Unsupported chat content part type: '{other}' (this model takes text only)"
            )))
        }
        None => return Err(refused("Missing 'type' field in multimodal part.")),
    };
    Ok(part.get(field).and_then(Value::as_str))
}

/// A message's content for the template: joined text ("string") or text parts ("openai").
fn content(parts: &[Value], format: ContentFormat) -> Result<Value, TokenizeError> {
    match format {
        ContentFormat::String => {
            let mut texts = Vec::with_capacity(parts.len());
            for part in parts {
                if let Some(t) = part_text(part)?.filter(|t| !t.is_empty()) {
                    texts.push(t);
                }
            }
            Ok(Value::from(texts.join("\n")))
        }
        ContentFormat::OpenAi => {
            let mut out = Vec::with_capacity(parts.len());
            for part in parts {
                let Some(text) = part_text(part)? else {
                    continue;
                };
                let mut p = Map::new();
                p.insert("type".into(), Value::from("text"));
                p.insert("text".into(), Value::from(text));
                // Keys that are not content-part fields survive (`_collect_extra_fields`).
                if let Value::Object(extra) = part {
                    for (k, v) in extra {
                        if !["type", "text", "refusal", "thinking", "signature"]
                            .contains(&k.as_str())
                        {
                            p.insert(k.clone(), v.clone());
                        }
                    }
                }
                out.push(Value::Object(p));
            }
            Ok(Value::Array(out))
        }
    }
}

/// `_postprocess_messages`: assistant tool-call arguments become objects (`{}` when they
/// are missing, empty, not JSON or not an object); an empty list is removed.
fn postprocess_tool_calls(messages: &mut [Map<String, Value>]) -> Result<(), TokenizeError> {
    for message in messages.iter_mut() {
        if message.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
            continue;
        };
        if calls.is_empty() {
            message.shift_remove("tool_calls");
            continue;
        }
        for call in calls.iter_mut() {
            let Value::Object(call) = call else {
                return Err(refused("assistant tool_calls entries must be objects."));
            };
            let kind_ok = call
                .get("type")
                .is_none_or(|t| t.as_str() == Some("function"));
            let Some(Value::Object(function)) = call.get_mut("function").filter(|_| kind_ok) else {
                return Err(refused(
                    "chat completions only support assistant tool_calls of type 'function'.",
                ));
            };
            let arguments = match function.get("arguments") {
                Some(Value::Object(o)) => Value::Object(o.clone()),
                Some(Value::String(s)) if !s.is_empty() => match serde_json::from_str::<Value>(s) {
                    Ok(parsed @ Value::Object(_)) => parsed,
                    _ => Value::Object(Map::new()),
                },
                _ => Value::Object(Map::new()),
            };
            function.insert("arguments".into(), arguments);
        }
    }
    Ok(())
}

/// `safe_apply_chat_template` for a template that does not know `developer`: those turns
/// become `system` (their tools dropped), and every system turn merges into one at the top.
fn developer_as_system(messages: Vec<Map<String, Value>>) -> Vec<Map<String, Value>> {
    let mut system_texts: Vec<String> = Vec::new();
    let mut rest = Vec::with_capacity(messages.len());
    let mut systems = 0;
    let mut first_at = None;
    let converted: Vec<Map<String, Value>> = messages
        .into_iter()
        .map(|mut m| {
            if m.get("role").and_then(Value::as_str) == Some("developer") {
                m.insert("role".into(), Value::from("system"));
                m.shift_remove("tools");
            }
            m
        })
        .collect();
    for (i, m) in converted.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) == Some("system") {
            systems += 1;
            first_at.get_or_insert(i);
        }
    }
    if systems <= 1 && first_at.is_none_or(|i| i == 0) {
        return converted;
    }
    for m in converted {
        if m.get("role").and_then(Value::as_str) != Some("system") {
            rest.push(m);
            continue;
        }
        let text = content_text(m.get("content"), "\n");
        if !text.is_empty() {
            system_texts.push(text);
        }
    }
    let mut system = Map::new();
    system.insert("role".into(), Value::from("system"));
    system.insert("content".into(), Value::from(system_texts.join("\n\n")));
    std::iter::once(system).chain(rest).collect()
}

/// transformers' `continue_final_message`: the final message's text (a string, or its
/// last text part) gets the tag appended; the render is cut at the tag.
fn tag_final_message(messages: &mut [Map<String, Value>]) -> Result<(), TokenizeError> {
    let tagged = |text: &str| Value::from(format!("{text}{CONTINUE_TAG} "));
    let last = messages.last_mut().ok_or_else(|| {
        refused(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
        )
    })?;
    match last.get_mut("content") {
        Some(Value::String(s)) => {
            let t = tagged(s);
            last.insert("content".into(), t);
            Ok(())
        }
        Some(Value::Array(parts)) => {
            let part = parts
                .iter_mut()
                .rev()
                .find(|p| p.get("text").is_some())
                .ok_or_else(|| refused("continue_final_message is set but we could not find any text to continue in the final message!"))?;
            let text = part
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if let Value::Object(p) = part {
                p.insert("text".into(), tagged(&text));
            }
            Ok(())
        }
        _ => Err(refused(
            "continue_final_message is set but the final message has no content",
        )),
    }
}
