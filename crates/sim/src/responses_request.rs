//! A `/v1/responses` request as SGLang reads it (sglang 0.5.23): its model
//! (`ResponsesRequest`, `protocol.py`, with its validators `normalize_reasoning_to_thinking`
//! and `normalize_responses_input`, `ResponseTool`'s dump and `effective_tool_choice`).
//! The chat it becomes is built in `responses_chat.rs`.

use serde_json::{json, Map, Value};

use super::errors::kind;
use super::fields::{self, get, opt_f64, opt_int, opt_object, opt_str};
use super::request::random_hex;

/// `RESPONSE_TOOL_TYPES`.
const TOOL_TYPES: [&str; 13] = [
    "function",
    "web_search",
    "web_search_preview",
    "code_interpreter",
    "file_search",
    "image_generation",
    "computer_use_preview",
    "local_shell",
    "shell",
    "mcp",
    "custom",
    "namespace",
    "tool_search",
];
/// `ReasoningEffortTier`, and the tiers a response echoes (`ECHOABLE_REASONING_EFFORTS`).
const EFFORTS: [&str; 8] = [
    "none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max",
];
const ECHOABLE: [&str; 4] = ["minimal", "low", "medium", "high"];
/// `include`'s literals.
const INCLUDES: [&str; 6] = [
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "message.input_image.image_url",
    "message.output_text.logprobs",
    "reasoning.encrypted_content",
];
/// Fields a generation takes from the request as they are (`PDRoutingFields`, cache keys).
const PASSED: [&str; 5] = [
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "cache_salt",
    "extra_key",
];

/// A checked `/v1/responses` request.
#[derive(Clone, Debug)]
pub(crate) struct ResponsesRequest {
    /// `request_id`: the response's id (`resp_<hex>` unless the client set one).
    pub(crate) id: String,
    pub(crate) model: Option<String>,
    pub(crate) input: Value,
    pub(crate) instructions: Option<String>,
    pub(crate) max_output_tokens: Option<i64>,
    pub(crate) previous_response_id: Option<String>,
    /// `store` (default true; `null` is kept as `None`, which stores nothing).
    pub(crate) store: Option<bool>,
    pub(crate) stream: bool,
    pub(crate) background: bool,
    /// `tools`, dumped as `ResponseTool` dumps them.
    pub(crate) tools: Vec<Value>,
    pub(crate) tool_choice: Value,
    pub(crate) parallel_tool_calls: bool,
    /// `reasoning.effort` and `reasoning.summary`, when `reasoning` was given.
    pub(crate) reasoning: Option<(Option<String>, Option<String>)>,
    pub(crate) include_logprobs: bool,
    pub(crate) chat_template_kwargs: Option<Map<String, Value>>,
    /// Echoed as given: `temperature`, `top_p`, `text`, `truncation`, `user`, `metadata`.
    pub(crate) echo: Map<String, Value>,
    /// Passed to the generation as given: `stop` and the PD / cache fields.
    pub(crate) passed: Map<String, Value>,
}

impl ResponsesRequest {
    /// `effective_tool_choice`: a named function or custom tool, or the string as given;
    /// any other object (built-in tools) is `"auto"`.
    pub(crate) fn effective_tool_choice(&self) -> Value {
        let Some(choice) = self.tool_choice.as_object() else {
            return self.tool_choice.clone();
        };
        let name = choice
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .or_else(|| {
                choice
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
            });
        let kind = choice.get("type").and_then(Value::as_str);
        match (kind, name) {
            (Some(kind @ ("function" | "custom")), Some(name)) if !name.is_empty() => {
                json!({"type": kind, "name": name})
            }
            _ => json!("auto"),
        }
    }

    /// The `reasoning` a response echoes.
    pub(crate) fn reasoning_echo(&self) -> Value {
        let effort = self
            .reasoning
            .as_ref()
            .and_then(|(effort, _)| effort.as_deref())
            .filter(|e| ECHOABLE.contains(e));
        json!({"effort": effort, "summary": null})
    }

    /// `reasoning.summary` was asked for.
    pub(crate) fn wants_summary(&self) -> bool {
        matches!(&self.reasoning, Some((_, Some(_))))
    }

    /// The tools the chat sees: each function tool (`_response_tools_to_chat_tools`).
    pub(crate) fn chat_tools(&self) -> Vec<Value> {
        self.tools
            .iter()
            .filter(|t| t.get("type").and_then(Value::as_str) == Some("function"))
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name"), "description": t.get("description"),
                    "parameters": t.get("parameters"), "strict": t.get("strict"),
                }})
            })
            .collect()
    }
}

/// The request model's checks: `Err` is a validation error's text.
pub(crate) fn parse(body: &Map<String, Value>) -> Result<ResponsesRequest, String> {
    let input = match fields::required(body, "input")? {
        Value::String(s) => Value::String(s.clone()),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::Object(item) => Ok(Value::Object(without_replayed_id(item))),
                    other => Err(format!(
                        "input.{i}: Input should be a valid dictionary, got {}",
                        kind(other)
                    )),
                })
                .collect::<Result<_, _>>()?,
        ),
        other => {
            return Err(format!(
                "input: Input should be a valid string or list, got {}",
                kind(other)
            ))
        }
    };
    let tools = match get(body, "tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .enumerate()
            .map(|(i, t)| tool(t, i))
            .collect::<Result<_, _>>()?,
        Some(v) => {
            return Err(format!(
                "tools: Input should be a valid list, got {}",
                kind(v)
            ))
        }
    };
    let tool_choice = match body.get("tool_choice") {
        None => json!("auto"),
        Some(Value::String(s)) if ["auto", "required", "none"].contains(&s.as_str()) => json!(s),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            return Err(
                "tool_choice: Input should be 'auto', 'required', 'none' or a dictionary".into(),
            )
        }
    };
    let reasoning = match opt_object(body, "reasoning")? {
        None => None,
        Some(r) => {
            let effort = match r.get("effort") {
                None => Some("medium".to_string()),
                Some(Value::Null) => None,
                Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => Some(e.clone()),
                Some(_) => {
                    return Err(format!(
                        "reasoning.effort: Input should be one of {EFFORTS:?}"
                    ))
                }
            };
            let summary = match r.get("summary") {
                None | Some(Value::Null) => None,
                Some(Value::String(s)) if ["auto", "concise", "detailed"].contains(&s.as_str()) => {
                    Some(s.clone())
                }
                Some(_) => {
                    return Err(
                        "reasoning.summary: Input should be 'auto', 'concise' or 'detailed'".into(),
                    )
                }
            };
            Some((effort, summary))
        }
    };
    let include_logprobs = match get(body, "include") {
        None => false,
        Some(Value::Array(list)) => {
            for item in list {
                if !item.as_str().is_some_and(|s| INCLUDES.contains(&s)) {
                    return Err(format!("include: Input should be one of {INCLUDES:?}"));
                }
            }
            list.iter().any(|i| i == "message.output_text.logprobs")
        }
        Some(v) => {
            return Err(format!(
                "include: Input should be a valid list, got {}",
                kind(v)
            ))
        }
    };
    let mut chat_template_kwargs = opt_object(body, "chat_template_kwargs")?.cloned();
    // `normalize_reasoning_to_thinking`: effort "none" switches thinking off, unless the
    // client's own kwargs say otherwise.
    if matches!(&reasoning, Some((Some(e), _)) if e == "none") {
        let mut kwargs = Map::new();
        kwargs.insert("thinking".into(), json!(false));
        kwargs.insert("enable_thinking".into(), json!(false));
        kwargs.extend(chat_template_kwargs.unwrap_or_default());
        chat_template_kwargs = Some(kwargs);
    }
    if let Some(v) = get(body, "truncation") {
        if !v.as_str().is_some_and(|t| t == "auto" || t == "disabled") {
            return Err("truncation: Input should be 'auto' or 'disabled'".into());
        }
    }
    opt_f64(body, "temperature")?;
    opt_f64(body, "top_p")?;
    opt_object(body, "metadata")?;
    opt_object(body, "text")?;
    opt_str(body, "user")?;
    let mut echo = Map::new();
    for name in ["temperature", "top_p", "text", "user", "metadata"] {
        echo.insert(name.into(), body.get(name).cloned().unwrap_or(Value::Null));
    }
    echo.insert(
        "truncation".into(),
        body.get("truncation").cloned().unwrap_or(json!("disabled")),
    );
    let mut passed = Map::new();
    for name in PASSED.iter().chain(&["stop"]) {
        if let Some(v) = get(body, name) {
            passed.insert((*name).to_string(), v.clone());
        }
    }
    let store = match body.get("store") {
        None => Some(true),
        Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(format!(
                "store: Input should be a valid boolean, got {}",
                kind(v)
            ))
        }
    };
    Ok(ResponsesRequest {
        id: opt_str(body, "request_id")?
            .map_or_else(|| format!("resp_{}", random_hex()), str::to_string),
        model: opt_str(body, "model")?.map(str::to_string),
        input,
        instructions: opt_str(body, "instructions")?.map(str::to_string),
        max_output_tokens: opt_int(body, "max_output_tokens")?,
        previous_response_id: opt_str(body, "previous_response_id")?.map(str::to_string),
        store,
        stream: fields::flag(body, "stream", false)?,
        background: fields::flag(body, "background", false)?,
        tools,
        tool_choice,
        parallel_tool_calls: fields::flag(body, "parallel_tool_calls", true)?,
        reasoning,
        include_logprobs,
        chat_template_kwargs,
        echo,
        passed,
    })
}

/// `_normalize_input_item_for_validation`: a replayed output item's string `id` is dropped.
fn without_replayed_id(item: &Map<String, Value>) -> Map<String, Value> {
    let mut item = item.clone();
    if item.get("id").is_some_and(Value::is_string) && get(&item, "content").is_some() {
        item.remove("id");
    }
    item
}

/// One `ResponseTool`, dumped with its defaults (extra keys kept).
fn tool(value: &Value, i: usize) -> Result<Value, String> {
    let Some(map) = value.as_object() else {
        return Err(format!(
            "tools.{i}: Input should be a valid dictionary, got {}",
            kind(value)
        ));
    };
    let kind = map.get("type").and_then(Value::as_str);
    if !kind.is_some_and(|k| TOOL_TYPES.contains(&k)) {
        return Err(format!(
            "tools.{i}.type: Input should be one of {TOOL_TYPES:?}"
        ));
    }
    if kind == Some("function")
        && map
            .get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        return Err(format!(
            "tools.{i}: Value error, Function tools must include a name."
        ));
    }
    let mut out = Map::new();
    out.insert("type".into(), json!(kind));
    for name in ["name", "description", "parameters"] {
        out.insert(name.into(), map.get(name).cloned().unwrap_or(Value::Null));
    }
    out.insert(
        "strict".into(),
        map.get("strict").cloned().unwrap_or(json!(false)),
    );
    for name in ["tools", "defer_loading", "format"] {
        out.insert(name.into(), map.get(name).cloned().unwrap_or(Value::Null));
    }
    for (k, v) in map {
        if !out.contains_key(k) {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok(Value::Object(out))
}
