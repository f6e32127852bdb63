//! Anthropic `tools` and `tool_choice` → OpenAI `tools`, `tool_choice` and
//! `parallel_tool_calls`.
//!
//! Follows vLLM `vllm/entrypoints/anthropic/serving.py` (`_convert_tools`,
//! `_convert_tool_choice`): `input_schema` becomes the function's `parameters` (with
//! `type: object` added when missing, as `protocol.py` `AnthropicTool.validate_input_schema`
//! does); `auto` → `"auto"`, `any` → `"required"`, `none` → `"none"`, `tool` → the named
//! function. Beyond vLLM: `disable_parallel_tool_use: true` → `parallel_tool_calls: false`,
//! a `tool` choice naming no defined tool is refused, and Anthropic's server tools
//! (`web_search_*`, `bash_*`, `text_editor_*`, …: any `type` other than `custom`) are refused,
//! since they run on Anthropic's servers. vLLM does not default `tool_choice` to `"auto"`
//! here: OpenAI's default with tools present is already `auto`.

use serde_json::{json, Map, Value};

use super::error::AnthropicError;
use super::json::present;

/// Writes the chat's `tools`, `tool_choice` and `parallel_tool_calls` from the body.
pub(super) fn translate(
    body: &Map<String, Value>,
    chat: &mut Map<String, Value>,
) -> Result<(), AnthropicError> {
    let mut names = Vec::new();
    if let Some(tools) = present(body, "tools") {
        let list = tools
            .as_array()
            .ok_or_else(|| AnthropicError::invalid("tools", "expected a list of tools"))?;
        let mut out = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            let (name, function) = tool_function(&format!("tools.{i}"), tool)?;
            names.push(name);
            out.push(json!({"type": "function", "function": function}));
        }
        if !out.is_empty() {
            chat.insert("tools".into(), Value::Array(out));
        }
    }
    if let Some(choice) = present(body, "tool_choice") {
        tool_choice(choice, &names, chat)?;
    }
    Ok(())
}

fn tool_function(path: &str, tool: &Value) -> Result<(String, Value), AnthropicError> {
    let obj = tool.as_object().ok_or_else(|| {
        AnthropicError::invalid(path, "expected a tool {name, description, input_schema}")
    })?;
    match present(obj, "type").and_then(Value::as_str) {
        None | Some("custom") => {}
        Some(other) => {
            return Err(AnthropicError::unsupported(
                format!("{path}.type"),
                format!("`{other}` is an Anthropic server tool; define a custom tool (name, description, input_schema) and run it in the client"),
            ))
        }
    }
    const KEYS: [&str; 6] = [
        "type",
        "name",
        "description",
        "input_schema",
        "cache_control",
        "strict",
    ];
    if let Some((key, _)) = obj
        .iter()
        .find(|(k, v)| !v.is_null() && !KEYS.contains(&k.as_str()))
    {
        return Err(AnthropicError::unsupported(
            format!("{path}.{key}"),
            format!("unknown field; a tool accepts {}", KEYS.join(", ")),
        ));
    }
    let name = present(obj, "name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            AnthropicError::invalid(format!("{path}.name"), "expected a non-empty string")
        })?;
    let mut schema = present(obj, "input_schema")
        .and_then(Value::as_object)
        .cloned()
        .ok_or_else(|| {
            AnthropicError::invalid(
                format!("{path}.input_schema"),
                "field required: the tool's JSON Schema object",
            )
        })?;
    schema.entry("type").or_insert_with(|| "object".into());
    let mut function = Map::new();
    function.insert("name".into(), name.into());
    if let Some(description) = present(obj, "description") {
        let Some(d) = description.as_str() else {
            return Err(AnthropicError::invalid(
                format!("{path}.description"),
                "expected a string",
            ));
        };
        function.insert("description".into(), d.into());
    }
    function.insert("parameters".into(), Value::Object(schema));
    if let Some(strict) = present(obj, "strict") {
        let Some(s) = strict.as_bool() else {
            return Err(AnthropicError::invalid(
                format!("{path}.strict"),
                "expected a boolean",
            ));
        };
        function.insert("strict".into(), s.into());
    }
    Ok((name.to_owned(), Value::Object(function)))
}

fn tool_choice(
    choice: &Value,
    names: &[String],
    chat: &mut Map<String, Value>,
) -> Result<(), AnthropicError> {
    let obj = choice.as_object().ok_or_else(|| {
        AnthropicError::invalid(
            "tool_choice",
            "expected an object such as {\"type\": \"auto\"}",
        )
    })?;
    let kind = present(obj, "type").and_then(Value::as_str);
    let allowed: &[&str] = match kind {
        Some("tool") => &["type", "name", "disable_parallel_tool_use"],
        Some("auto" | "any") => &["type", "disable_parallel_tool_use"],
        _ => &["type"],
    };
    if let Some((key, _)) = obj
        .iter()
        .find(|(k, v)| !v.is_null() && !allowed.contains(&k.as_str()))
    {
        return Err(AnthropicError::unsupported(
            format!("tool_choice.{key}"),
            format!(
                "not accepted with this tool_choice type; accepted: {}",
                allowed.join(", ")
            ),
        ));
    }
    let openai = match kind {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = present(obj, "name")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    AnthropicError::invalid(
                        "tool_choice.name",
                        "field required when type is \"tool\"",
                    )
                })?;
            if !names.iter().any(|n| n == name) {
                return Err(AnthropicError::invalid(
                    "tool_choice.name",
                    format!("`{name}` is not among the request's tools"),
                ));
            }
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(AnthropicError::invalid(
                "tool_choice.type",
                "expected \"auto\", \"any\", \"tool\" or \"none\"",
            ))
        }
    };
    if kind != Some("none") && names.is_empty() {
        return Err(AnthropicError::invalid(
            "tool_choice",
            "a tool_choice other than \"none\" needs `tools`",
        ));
    }
    chat.insert("tool_choice".into(), openai);
    if let Some(flag) = present(obj, "disable_parallel_tool_use") {
        let Some(disable) = flag.as_bool() else {
            return Err(AnthropicError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "expected a boolean",
            ));
        };
        chat.insert("parallel_tool_calls".into(), (!disable).into());
    }
    Ok(())
}
