//! vLLM's tools (0.34.0): `chat_completion/protocol.py` `check_tool_usage` (`tools: []` is
//! no tools; the `tool_choice` default and checks) and `ChatCompletionToolsParam.model_dump()`
//! (`description` and `parameters` null when absent), as `online_renderer.py` `render_chat`
//! hands them to the template (`tool_choice: "none"` keeps them).

use serde_json::{Map, Value};

use super::{refused, ChatRequest};
use crate::TokenizeError;

/// `check_tool_usage` and the tools the template sees (`render_chat`).
pub(super) fn tool_usage(request: &ChatRequest<'_>) -> Result<Option<Value>, TokenizeError> {
    let tools = match request.tools {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) if list.is_empty() => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => return Err(refused("`tools` must be a list")),
    };
    match request.field("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "none" => {}
        // `tools: []` with auto/required became "none".
        Some(Value::String(s)) if (s == "auto" || s == "required") && tools.is_none() => {
            if request.tools.is_none_or(Value::is_null) {
                return Err(refused("When using `tool_choice`, `tools` must be set."));
            }
        }
        Some(Value::String(s)) if s == "auto" || s == "required" => {}
        Some(Value::Object(choice)) => {
            let Some(tools) = tools else {
                return Err(refused("When using `tool_choice`, `tools` must be set."));
            };
            let name = choice
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| refused("Invalid value for `function`: `name` must be a non-empty string."))?;
            let known = tools.iter().any(|t| {
                t.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) == Some(name)
            });
            if !known {
                return Err(refused(format!(
                    "The tool specified in `tool_choice` does not match any of the specified `tools`: {name}"
                )));
            }
        }
        Some(_) => return Err(refused("Invalid value for `tool_choice`: must be \"none\", \"auto\", \"required\" or a named function")),
    }
    let Some(tools) = tools else {
        return Ok(None);
    };
    tools
        .iter()
        .map(dump_tool)
        .collect::<Result<Vec<_>, _>>()
        .map(|t| Some(Value::Array(t)))
}

/// `ChatCompletionToolsParam.model_dump()`.
fn dump_tool(tool: &Value) -> Result<Value, TokenizeError> {
    let function = tool
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| refused("a tool needs a `function` object"))?;
    let name = function
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| refused("a tool's `function.name` must be a string"))?;
    let mut f = Map::new();
    f.insert("name".into(), Value::from(name));
    f.insert(
        "description".into(),
        function.get("description").cloned().unwrap_or(Value::Null),
    );
    f.insert(
        "parameters".into(),
        function.get("parameters").cloned().unwrap_or(Value::Null),
    );
    if let Some(strict) = function.get("strict").filter(|v| !v.is_null()) {
        f.insert("strict".into(), strict.clone());
    }
    let defer = function
        .get("defer_loading")
        .filter(|v| !v.is_null())
        .or_else(|| tool.get("defer_loading").filter(|v| !v.is_null()));
    if let Some(defer) = defer {
        f.insert("defer_loading".into(), defer.clone());
    }
    let mut out = Map::new();
    out.insert("type".into(), Value::from("function"));
    out.insert("function".into(), Value::Object(f));
    if let Some(defer) = tool.get("defer_loading").filter(|v| !v.is_null()) {
        out.insert("defer_loading".into(), defer.clone());
    }
    Ok(Value::Object(out))
}
