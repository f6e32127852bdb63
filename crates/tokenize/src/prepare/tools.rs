//! SGLang's tools: how `tools` are dumped for the template, the `tool_choice` default and
//! checks, and which tools the template sees (sglang 0.5.23).
//!
//! - `protocol.py` `Tool` / `Function` (`Function._serialize`): a tool dumps as
//!   `{type, function, defer_loading: null}`; its function as the client's keys first, then
//!   `description, name, parameters` (null when absent), `strict` and `defer_loading` only
//!   when set;
//! - `protocol.py` `set_tool_choice_default`: absent `tool_choice` is `"none"` without tools
//!   (request or system-message tools), else `"auto"`;
//! - `serving_chat.py` `_validate_request`: `required` and named choices need tools, a named
//!   tool must exist, tool names are unique when messages carry tools, and parameter schemas
//!   have their types normalized (`function_call/utils.py` `normalize_json_schema_types`);
//! - `serving_chat.py` `_process_messages`: `"none"` hides every tool from the template, a
//!   named choice shows only that tool, `[]` is no tools.

use serde_json::{Map, Value};

use super::refused;
use super::schema::{check_schema, normalize_schema_types};
use crate::TokenizeError;

/// `Function`'s fields in declared order.
const FUNCTION_FIELDS: [&str; 5] = [
    "description",
    "name",
    "parameters",
    "strict",
    "defer_loading",
];

/// The request's `tool_choice`, after its default.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ToolChoice {
    None,
    Auto,
    Required,
    Named(Option<String>),
}

/// `tools` dumped (`Tool.model_dump()` each); None for absent or null.
pub(super) fn dump_list(
    tools: Option<&Value>,
) -> Result<Option<Vec<Map<String, Value>>>, TokenizeError> {
    match tools {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(list)) => list
            .iter()
            .map(dump_tool)
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(refused("`tools` must be a list of tools")),
    }
}

fn dump_tool(tool: &Value) -> Result<Map<String, Value>, TokenizeError> {
    let Value::Object(t) = tool else {
        return Err(refused("a tool must be an object"));
    };
    let kind = match t.get("type") {
        None | Some(Value::Null) => Value::from("function"),
        Some(s @ Value::String(_)) => s.clone(),
        Some(_) => return Err(refused("a tool's `type` must be a string")),
    };
    let tool_defer = bool_or_null(t.get("defer_loading"), "defer_loading")?;
    let Some(Value::Object(f)) = t.get("function") else {
        return Err(refused("a tool needs a `function` object"));
    };
    let name = match f.get("name") {
        Some(s @ Value::String(_)) => s.clone(),
        _ => return Err(refused("a tool's `function.name` must be a string")),
    };
    let description = match f.get("description") {
        None | Some(Value::Null) => Value::Null,
        Some(s @ Value::String(_)) => s.clone(),
        Some(_) => return Err(refused("a tool's `function.description` must be a string")),
    };
    let parameters = match f.get("parameters") {
        None | Some(Value::Null) => Value::Null,
        Some(p @ Value::Object(_)) => p.clone(),
        Some(_) => return Err(refused("a tool's `function.parameters` must be an object")),
    };
    let strict = bool_or_null(f.get("strict"), "function.strict")?;
    // `_propagate_defer_loading`: the tool's flag fills the function's.
    let mut defer = bool_or_null(f.get("defer_loading"), "function.defer_loading")?;
    if defer.is_null() {
        defer = tool_defer.clone();
    }
    let mut data = Map::new();
    data.insert("description".into(), description);
    data.insert("name".into(), name);
    data.insert("parameters".into(), parameters);
    if !strict.is_null() {
        data.insert("strict".into(), strict);
    }
    if !defer.is_null() {
        data.insert("defer_loading".into(), defer);
    }
    // The client's key order first (`_capture_key_order`), then the declared order.
    let mut function = Map::new();
    for key in f.keys().map(String::as_str).chain(FUNCTION_FIELDS) {
        if let Some(v) = data.get(key) {
            function.entry(key.to_owned()).or_insert_with(|| v.clone());
        }
    }
    let mut out = Map::new();
    out.insert("type".into(), kind);
    out.insert("function".into(), Value::Object(function));
    out.insert("defer_loading".into(), tool_defer);
    Ok(out)
}

fn bool_or_null(value: Option<&Value>, what: &str) -> Result<Value, TokenizeError> {
    match value {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(b @ Value::Bool(_)) => Ok(b.clone()),
        Some(_) => Err(refused(format!("a tool's `{what}` must be a boolean"))),
    }
}

/// Tools carried by system, developer and root messages (`_effective_tools`).
fn message_tools(messages: &[Map<String, Value>]) -> impl Iterator<Item = &Map<String, Value>> {
    messages
        .iter()
        .filter(|m| {
            matches!(
                m.get("role").and_then(Value::as_str),
                Some("system" | "developer" | "root")
            )
        })
        .filter_map(|m| m.get("tools").and_then(Value::as_array))
        .flatten()
        .filter_map(Value::as_object)
}

/// `tool_choice` with `set_tool_choice_default` applied.
pub(super) fn choice(
    value: Option<&Value>,
    tools: Option<&Vec<Map<String, Value>>>,
    messages: &[Map<String, Value>],
) -> Result<ToolChoice, TokenizeError> {
    match value {
        None | Some(Value::Null) => {
            let none = tools.is_none() && message_tools(messages).next().is_none();
            Ok(if none { ToolChoice::None } else { ToolChoice::Auto })
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(refused(format!(
                "tool_choice must be \"none\", \"auto\", \"required\" or a named function, not \"{other}\""
            ))),
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_owned);
            Ok(ToolChoice::Named(name))
        }
        Some(_) => Err(refused("tool_choice must be a string or an object")),
    }
}

/// `_validate_request`'s tool checks; normalizes parameter schema types in place.
pub(super) fn check(
    choice: &ToolChoice,
    tools: Option<&Vec<Map<String, Value>>>,
    messages: &mut [Map<String, Value>],
) -> Result<(), TokenizeError> {
    let name_of = |t: &Map<String, Value>| {
        t.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let effective: Vec<Option<String>> = tools
        .into_iter()
        .flatten()
        .chain(message_tools(messages))
        .map(name_of)
        .collect();
    match choice {
        ToolChoice::Required if effective.is_empty() => {
            return Err(refused(
                "Tools cannot be empty if tool choice is set to required.",
            ))
        }
        ToolChoice::Named(_) if effective.is_empty() => {
            return Err(refused(
                "Tools cannot be empty if tool choice is set to a specific tool.",
            ))
        }
        ToolChoice::Named(Some(name)) if !effective.iter().any(|n| n.as_deref() == Some(name)) => {
            return Err(refused(format!("Tool '{name}' not found in tools list.")))
        }
        _ => {}
    }
    if message_tools(messages).next().is_some() {
        let mut seen = std::collections::HashSet::new();
        if !effective.iter().all(|n| seen.insert(n.clone())) {
            return Err(refused(
                "Tool names must be unique across request and message tools.",
            ));
        }
    }
    // Each tool's parameters, types normalized, must be a valid JSON Schema.
    let all: Vec<&Map<String, Value>> = tools
        .into_iter()
        .flatten()
        .chain(message_tools(messages))
        .collect();
    for (i, tool) in all.into_iter().enumerate() {
        if let Some(parameters) = tool
            .get("function")
            .and_then(|f| f.get("parameters"))
            .filter(|p| !p.is_null())
        {
            let mut schema = parameters.clone();
            normalize_schema_types(&mut schema);
            if let Err(why) = check_schema(&schema, 0) {
                return Err(refused(format!(
                    "Tool {i} function has invalid 'parameters' schema: {why}"
                )));
            }
        }
    }
    for message in messages.iter_mut() {
        if let Some(Value::Array(list)) = message.get_mut("tools") {
            list.iter_mut().for_each(normalize_tool);
        }
    }
    Ok(())
}

/// Which tools the template sees (`_process_messages`), their schema types normalized.
pub(super) fn selected(
    choice: &ToolChoice,
    tools: Option<Vec<Map<String, Value>>>,
) -> Option<Vec<Value>> {
    let tools = tools?;
    let mut picked: Vec<Value> = match choice {
        ToolChoice::None => return None,
        ToolChoice::Named(name) => tools
            .into_iter()
            .filter(|t| {
                t.get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    == name.as_deref()
            })
            .map(Value::Object)
            .collect(),
        ToolChoice::Auto | ToolChoice::Required => tools.into_iter().map(Value::Object).collect(),
    };
    picked.iter_mut().for_each(normalize_tool);
    (!picked.is_empty()).then_some(picked)
}

fn normalize_tool(tool: &mut Value) {
    if let Some(parameters) = tool
        .get_mut("function")
        .and_then(|f| f.get_mut("parameters"))
        .filter(|p| !p.is_null())
    {
        normalize_schema_types(parameters);
    }
}

/// `ToolCall.model_dump()`: `{id, index, type, function: {name, arguments}}`, nested
/// nulls kept.
pub(super) fn dump_call(call: &Value) -> Result<Value, String> {
    let Value::Object(c) = call else {
        return Err("a tool call must be an object".into());
    };
    let string_or_null = |v: Option<&Value>, what: &str| match v {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(s @ Value::String(_)) => Ok(s.clone()),
        Some(_) => Err(format!("tool call `{what}` must be a string")),
    };
    let index = match c.get("index") {
        None | Some(Value::Null) => Value::Null,
        Some(n) if n.is_i64() || n.is_u64() => n.clone(),
        Some(_) => return Err("tool call `index` must be an integer".into()),
    };
    match c.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return Err("tool call `type` must be \"function\"".into()),
    }
    let function = match c.get("function") {
        Some(Value::Object(f)) => {
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Null,
                Some(a @ (Value::String(_) | Value::Object(_))) => a.clone(),
                Some(_) => {
                    return Err(
                        "tool call `function.arguments` must be a string or an object".into(),
                    )
                }
            };
            let mut out = Map::new();
            out.insert(
                "name".into(),
                string_or_null(f.get("name"), "function.name")?,
            );
            out.insert("arguments".into(), arguments);
            out
        }
        _ => return Err("a tool call needs a `function` object".into()),
    };
    let mut out = Map::new();
    out.insert("id".into(), string_or_null(c.get("id"), "id")?);
    out.insert("index".into(), index);
    out.insert("type".into(), Value::from("function"));
    out.insert("function".into(), Value::Object(function));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn function_dump_keeps_the_clients_order_and_sglang_defaults() {
        let tools = dump_list(Some(&json!([{"type": "function", "function": {"parameters": {"type": "object"}, "name": "f"}}])))
            .unwrap()
            .unwrap();
        assert_eq!(
            Value::Object(tools[0].clone()).to_string(),
            r#"{"type":"function","function":{"parameters":{"type":"object"},"name":"f","description":null},"defer_loading":null}"#
        );
        let strict = dump_list(Some(&json!([{"function": {"name": "g", "strict": true}}])))
            .unwrap()
            .unwrap();
        assert_eq!(
            Value::Object(strict[0].clone()).to_string(),
            r#"{"type":"function","function":{"name":"g","strict":true,"description":null,"parameters":null},"defer_loading":null}"#
        );
    }

    #[test]
    fn tool_choice_defaults_and_filters() {
        let tools = dump_list(Some(
            &json!([{"function": {"name": "a"}}, {"function": {"name": "b"}}]),
        ))
        .unwrap();
        assert_eq!(choice(None, tools.as_ref(), &[]).unwrap(), ToolChoice::Auto);
        assert_eq!(choice(None, None, &[]).unwrap(), ToolChoice::None);
        let named = choice(
            Some(&json!({"type": "function", "function": {"name": "b"}})),
            tools.as_ref(),
            &[],
        )
        .unwrap();
        let picked = selected(&named, tools.clone()).unwrap();
        assert_eq!(picked.len(), 1);
        assert_eq!(selected(&ToolChoice::None, tools.clone()), None);
        assert!(check(
            &ToolChoice::Named(Some("zz".into())),
            tools.as_ref(),
            &mut []
        )
        .is_err());
        assert!(check(&ToolChoice::Required, None, &mut []).is_err());
    }
}
