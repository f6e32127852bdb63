//! `POST /v1/messages` and `/v1/messages/count_tokens` bodies → an OpenAI chat completions
//! body: the top-level fields, which are passed, translated, stripped or refused.
//!
//! | Anthropic field | chat field | source |
//! |---|---|---|
//! | `model` | `model` | vLLM `serving.py` `_build_base_request` |
//! | `system`, `messages` | `messages` (see `messages.rs`) | `_convert_system_message`, `_convert_messages` |
//! | `max_tokens` (required, > 0) | `max_tokens` | `_build_base_request`; `protocol.py` `validate_max_tokens` |
//! | `stop_sequences` | `stop` | `_build_base_request` |
//! | `temperature`, `top_p` (0–1), `top_k` (≥ 0) | the same names | `_build_base_request`; ranges from Anthropic's Messages reference |
//! | `metadata.user_id` | `user` | Anthropic documents it as an opaque end-user id, which is what OpenAI's `user` is |
//! | `stream` | `stream`, `stream_options: {include_usage: true}` | `_handle_streaming_options` (which also asks `continuous_usage_stats`; see `stream.rs` for why we do not) |
//! | `thinking` `{type: enabled, budget_tokens}` / `{type: disabled}` | `chat_template_kwargs.enable_thinking` | the variable Qwen3's chat template reads; the budget is checked, not enforced (no engine enforces it) |
//! | `tools`, `tool_choice` | `tools`, `tool_choice`, `parallel_tool_calls` (see `tools.rs`) | `_convert_tools`, `_convert_tool_choice` |
//! | `output_config.format` (`json_schema`) | `response_format` | `_handle_output_config` |
//! | `service_tier` | stripped | Anthropic's capacity tier: no engine meaning, and refusing it would break clients that always set it |
//! | `container`, `mcp_servers`, `context_management`, `output_config.effort` | refused | features that run on Anthropic's servers (code-execution containers, MCP connections, context editing) or change the prompt in ways the gateway does not model |
//! | anything else | refused | unknown to the gateway (fail-closed) |
//!
//! A field whose value is `null` is treated as absent everywhere, as Anthropic does for its
//! optional fields: the SDK's models dump unset optionals as `null` when a client echoes them.

use serde_json::{json, Map, Value};

use super::error::AnthropicError;
use super::json::present;
use super::{messages, tools};

/// Fields `/v1/messages` translates.
pub const MESSAGES_FIELDS: [&str; 14] = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
];

/// Fields `/v1/messages/count_tokens` translates: what shapes the prompt, nothing that
/// shapes the generation.
pub const COUNT_TOKENS_FIELDS: [&str; 6] = [
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
];

/// Documented fields dropped without an error.
pub const STRIPPED_FIELDS: [&str; 1] = ["service_tier"];

/// Documented fields refused with a reason.
const REFUSED_FIELDS: [(&str, &str); 3] = [
    (
        "container",
        "code-execution containers run on Anthropic's servers; this gateway serves models without them",
    ),
    (
        "mcp_servers",
        "this gateway connects to no MCP servers; define the tools in `tools` and run them in the client",
    ),
    (
        "context_management",
        "server-side context editing is not available; trim the history in the client",
    ),
];

/// Translates a `/v1/messages` body into an OpenAI chat completions body.
pub fn to_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, AnthropicError> {
    check_fields(body, &MESSAGES_FIELDS)?;
    let mut chat = prompt_fields(body)?;
    let Some(max_tokens) = present(body, "max_tokens") else {
        return Err(AnthropicError::invalid(
            "max_tokens",
            "field required: the most tokens to generate, a positive integer",
        ));
    };
    let max_tokens = positive_int(max_tokens, "max_tokens")?;
    chat.insert("max_tokens".into(), max_tokens.into());
    if let Some(thinking) = present(body, "thinking") {
        check_budget(thinking, max_tokens)?;
    }
    if let Some(stops) = stop_sequences(body)? {
        if !stops.is_empty() {
            chat.insert("stop".into(), json!(stops));
        }
    }
    for (field, max) in [("temperature", 1.0), ("top_p", 1.0)] {
        if let Some(v) = present(body, field) {
            chat.insert(field.into(), unit_number(v, field, max)?);
        }
    }
    if let Some(v) = present(body, "top_k") {
        let Some(k) = v.as_u64() else {
            return Err(AnthropicError::invalid("top_k", "expected an integer ≥ 0"));
        };
        chat.insert("top_k".into(), k.into());
    }
    if let Some(user) = user_id(body)? {
        chat.insert("user".into(), user.into());
    }
    if let Some(v) = present(body, "stream") {
        let Some(stream) = v.as_bool() else {
            return Err(AnthropicError::invalid("stream", "expected a boolean"));
        };
        if stream {
            chat.insert("stream".into(), true.into());
            chat.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    if let Some(v) = present(body, "output_config") {
        if let Some(format) = output_format(v)? {
            chat.insert("response_format".into(), format);
        }
    }
    Ok(chat)
}

/// Translates a `/v1/messages/count_tokens` body into the chat body whose prompt the
/// gateway counts (vLLM `serving.py` `count_tokens` renders the same conversion). It has no
/// `max_tokens` and no `stream`: Anthropic's count_tokens takes neither.
pub fn count_tokens_to_chat(
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, AnthropicError> {
    check_fields(body, &COUNT_TOKENS_FIELDS)?;
    prompt_fields(body)
}

/// The request's `stop_sequences`, for matching the engine's stop string to Anthropic's
/// `stop_sequence` in the reply (`response::from_chat`, `StreamTranslator`).
pub fn stop_sequences(body: &Map<String, Value>) -> Result<Option<Vec<String>>, AnthropicError> {
    let Some(v) = present(body, "stop_sequences") else {
        return Ok(None);
    };
    let err = || AnthropicError::invalid("stop_sequences", "expected a list of strings");
    let list = v.as_array().ok_or_else(err)?;
    list.iter()
        .map(|s| s.as_str().map(str::to_owned).ok_or_else(err))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The fields both endpoints share: what the engine renders into the prompt.
fn prompt_fields(body: &Map<String, Value>) -> Result<Map<String, Value>, AnthropicError> {
    let mut chat = Map::new();
    let model = present(body, "model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| AnthropicError::invalid("model", "field required: a model name"))?;
    chat.insert("model".into(), model.into());
    let converted = messages::to_chat_messages(body)?;
    chat.insert("messages".into(), Value::Array(converted.messages));
    if converted.continues_final {
        // Anthropic continues a final assistant turn (prefill); the chat equivalent is
        // vLLM's `continue_final_message`, which vLLM refuses together with the default
        // `add_generation_prompt: true`. SGLang's handling of the pair is unverified.
        chat.insert("continue_final_message".into(), true.into());
        chat.insert("add_generation_prompt".into(), false.into());
    }
    tools::translate(body, &mut chat)?;
    if let Some(thinking) = present(body, "thinking") {
        let enable = thinking_enabled(thinking)?;
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": enable}),
        );
    }
    Ok(chat)
}

/// Refuses every field outside `allowed` and [`STRIPPED_FIELDS`], naming it.
fn check_fields(body: &Map<String, Value>, allowed: &[&str]) -> Result<(), AnthropicError> {
    for (key, value) in body {
        if value.is_null()
            || allowed.contains(&key.as_str())
            || STRIPPED_FIELDS.contains(&key.as_str())
        {
            continue;
        }
        if let Some((_, reason)) = REFUSED_FIELDS.iter().find(|(f, _)| *f == key.as_str()) {
            return Err(AnthropicError::unsupported(key.as_str(), *reason));
        }
        return Err(AnthropicError::unsupported(
            key.as_str(),
            format!(
                "unknown field; this endpoint accepts {}",
                allowed.join(", ")
            ),
        ));
    }
    Ok(())
}

fn positive_int(v: &Value, path: &str) -> Result<u64, AnthropicError> {
    v.as_u64()
        .filter(|n| *n > 0)
        .ok_or_else(|| AnthropicError::invalid(path, "expected a positive integer"))
}

fn unit_number(v: &Value, path: &str, max: f64) -> Result<Value, AnthropicError> {
    match v.as_f64() {
        Some(x) if (0.0..=max).contains(&x) => Ok(v.clone()),
        _ => Err(AnthropicError::invalid(
            path,
            format!("expected a number between 0 and {max}"),
        )),
    }
}

fn user_id(body: &Map<String, Value>) -> Result<Option<String>, AnthropicError> {
    let Some(meta) = present(body, "metadata") else {
        return Ok(None);
    };
    let meta = meta
        .as_object()
        .ok_or_else(|| AnthropicError::invalid("metadata", "expected an object"))?;
    for (key, value) in meta {
        if key != "user_id" && !value.is_null() {
            return Err(AnthropicError::unsupported(
                format!("metadata.{key}"),
                "unknown field; metadata accepts user_id",
            ));
        }
    }
    match present(meta, "user_id") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(AnthropicError::invalid(
            "metadata.user_id",
            "expected a string",
        )),
    }
}

/// `thinking.type`: `enabled` or `disabled`.
fn thinking_enabled(thinking: &Value) -> Result<bool, AnthropicError> {
    let obj = thinking
        .as_object()
        .ok_or_else(|| AnthropicError::invalid("thinking", "expected an object"))?;
    let enabled = match present(obj, "type").and_then(Value::as_str) {
        Some("enabled") => true,
        Some("disabled") => false,
        _ => {
            return Err(AnthropicError::invalid(
                "thinking.type",
                "expected \"enabled\" (with budget_tokens) or \"disabled\"",
            ))
        }
    };
    for (key, value) in obj {
        let known = key == "type" || (enabled && key == "budget_tokens");
        if !known && !value.is_null() {
            return Err(AnthropicError::unsupported(
                format!("thinking.{key}"),
                "unknown field; thinking accepts type and, when enabled, budget_tokens",
            ));
        }
    }
    if enabled {
        let Some(budget) = present(obj, "budget_tokens") else {
            return Err(AnthropicError::invalid(
                "thinking.budget_tokens",
                "field required when thinking is enabled: a positive integer below max_tokens",
            ));
        };
        positive_int(budget, "thinking.budget_tokens")?;
    }
    Ok(enabled)
}

/// Anthropic requires `budget_tokens < max_tokens` (Messages reference, `thinking`).
fn check_budget(thinking: &Value, max_tokens: u64) -> Result<(), AnthropicError> {
    let budget = thinking.get("budget_tokens").and_then(Value::as_u64);
    match budget {
        Some(b) if b >= max_tokens => Err(AnthropicError::invalid(
            "thinking.budget_tokens",
            format!("must be less than max_tokens ({max_tokens})"),
        )),
        _ => Ok(()),
    }
}

/// `output_config.format {type: json_schema, schema}` → `response_format` (vLLM
/// `_handle_output_config`); `effort` is refused: it maps to no variable the gateway's
/// prompt count models.
fn output_format(config: &Value) -> Result<Option<Value>, AnthropicError> {
    let obj = config
        .as_object()
        .ok_or_else(|| AnthropicError::invalid("output_config", "expected an object"))?;
    for (key, value) in obj {
        if key != "format" && !value.is_null() {
            return Err(AnthropicError::unsupported(
                format!("output_config.{key}"),
                "not supported; output_config accepts format",
            ));
        }
    }
    let Some(format) = present(obj, "format") else {
        return Ok(None);
    };
    let schema = format
        .as_object()
        .filter(|f| present(f, "type").and_then(Value::as_str) == Some("json_schema"))
        .and_then(|f| present(f, "schema"))
        .filter(|s| s.is_object())
        .ok_or_else(|| {
            AnthropicError::invalid(
                "output_config.format",
                "expected {\"type\": \"json_schema\", \"schema\": {...}}",
            )
        })?;
    Ok(Some(json!({
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    })))
}
