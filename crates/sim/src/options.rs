//! The OpenAI request fields that shape an answer rather than its prompt: `n`, `stop`,
//! logprobs, a tool call forced by `tool_choice`, `response_format`, and thinking
//! (`chat_template_kwargs.enable_thinking`, `reasoning_effort`, `separate_reasoning`).
//!
//! They are read from the request JSON and checked as SGLang checks them (its pydantic
//! models and `_validate_request`); a bad value is a 400 with SGLang's message where it has
//! one. The prompt itself is rendered elsewhere (`request.rs`) and not touched here.

use serde_json::Value;

use super::request::Api;

/// Most choices one request may ask for (OpenAI's bound).
const MAX_N: u64 = 128;
/// Most alternatives per token a request may ask for (OpenAI's `top_logprobs` bound).
const MAX_TOP_LOGPROBS: u64 = 20;

/// What a request asks of its answer, beyond its prompt and `max_tokens`.
#[derive(Clone, Debug)]
pub(crate) struct Options {
    /// Choices per prompt (`n`).
    pub(crate) n: usize,
    /// Stop strings, in the order given; empty strings are dropped.
    pub(crate) stop: Vec<String>,
    /// Logprobs asked for, with this many alternatives per token (chat: `logprobs: true` and
    /// `top_logprobs`; completions: `logprobs: k`).
    pub(crate) logprobs: Option<usize>,
    /// A tool call the answer must be (`tool_choice` `"required"` or a named function).
    pub(crate) tool: Option<ForcedTool>,
    /// A JSON answer (`response_format`).
    pub(crate) format: Option<Format>,
    /// `enable_thinking` as the request sets it (`chat_template_kwargs`, or
    /// `reasoning_effort` where that is not given); `None`: the template's default.
    pub(crate) enable_thinking: Option<bool>,
    /// `separate_reasoning` (SGLang's default: true); it matters only with a reasoning parser.
    pub(crate) separate_reasoning: bool,
    /// The text of the last message when it is a tool's result (`role: "tool"`).
    pub(crate) tool_result: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            n: 1,
            stop: Vec::new(),
            logprobs: None,
            tool: None,
            format: None,
            enable_thinking: None,
            separate_reasoning: true,
            tool_result: None,
        }
    }
}

/// The tool a `tool_choice` forces.
#[derive(Clone, Debug)]
pub(crate) struct ForcedTool {
    pub(crate) name: String,
    /// Its `parameters` JSON schema (`{}` when the tool has none).
    pub(crate) parameters: Value,
    /// `"required"`: the engine's constrained output is a JSON array of `{name, parameters}`;
    /// a named function: the arguments object alone.
    pub(crate) required: bool,
}

/// A `response_format` that constrains the answer to JSON.
#[derive(Clone, Debug)]
pub(crate) enum Format {
    /// `{"type": "json_object"}`: some JSON object.
    JsonObject,
    /// `{"type": "json_schema", ...}`: a document valid for this schema.
    JsonSchema(Value),
}

/// The options of a request body of `api`; `/generate` takes none of them here.
pub(crate) fn parse(api: Api, body: &Value) -> Result<Options, String> {
    if api == Api::Generate {
        return Ok(Options::default());
    }
    let mut options = Options {
        n: n(body.get("n"))?,
        stop: stop(body.get("stop"))?,
        ..Options::default()
    };
    match api {
        Api::Chat => {
            options.logprobs = chat_logprobs(body)?;
            options.tool = forced_tool(body)?;
            options.format = format(body.get("response_format"))?;
            options.enable_thinking = enable_thinking(body)?;
            options.separate_reasoning =
                flag(body.get("separate_reasoning"), "separate_reasoning", true)?;
            options.tool_result = tool_result(body.get("messages"));
        }
        Api::Completions => {
            options.logprobs = match body.get("logprobs") {
                None | Some(Value::Null) => None,
                Some(v) => Some(bounded(v, "logprobs", 0, MAX_TOP_LOGPROBS)?),
            };
        }
        Api::Generate => {}
    }
    Ok(options)
}

fn bounded(value: &Value, name: &str, min: u64, max: u64) -> Result<usize, String> {
    value
        .as_u64()
        .filter(|v| (min..=max).contains(v))
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| format!("{name} must be an integer between {min} and {max}"))
}

fn flag(value: Option<&Value>, name: &str, default: bool) -> Result<bool, String> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(format!("{name} must be a boolean")),
    }
}

fn n(value: Option<&Value>) -> Result<usize, String> {
    match value {
        None | Some(Value::Null) => Ok(1),
        Some(v) => bounded(v, "n", 1, MAX_N),
    }
}

fn stop(value: Option<&Value>) -> Result<Vec<String>, String> {
    let invalid = || "stop must be a string or a list of strings".to_string();
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(invalid)?,
        Some(_) => return Err(invalid()),
    };
    Ok(list.into_iter().filter(|s| !s.is_empty()).collect())
}

fn chat_logprobs(body: &Value) -> Result<Option<usize>, String> {
    let top = match body.get("top_logprobs") {
        None | Some(Value::Null) => 0,
        Some(v) => bounded(v, "top_logprobs", 0, MAX_TOP_LOGPROBS)?,
    };
    Ok(flag(body.get("logprobs"), "logprobs", false)?.then_some(top))
}

/// The tools of the request as `(name, parameters)`, checked for a function name each.
fn tools(body: &Value) -> Result<Vec<(String, Value)>, String> {
    let list = match body.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err("tools must be a list of tools".into()),
    };
    list.iter()
        .enumerate()
        .map(|(i, tool)| {
            let function = tool.get("function");
            let name = function.and_then(|f| f.get("name")).and_then(Value::as_str);
            let Some(name) = name else {
                return Err(format!("Tool {i} must have a function with a name"));
            };
            let parameters = function
                .and_then(|f| f.get("parameters"))
                .filter(|p| !p.is_null())
                .cloned()
                .unwrap_or_else(|| Value::Object(serde_json::Map::new()));
            if !parameters.is_object() && !parameters.is_boolean() {
                return Err(format!(
                    "Tool {i} function has invalid 'parameters' schema: not an object"
                ));
            }
            Ok((name.to_string(), parameters))
        })
        .collect()
}

/// The tool `tool_choice` forces, if it forces one (`"required"` or a named function).
fn forced_tool(body: &Value) -> Result<Option<ForcedTool>, String> {
    let tools = tools(body)?;
    let choice = body.get("tool_choice").filter(|c| !c.is_null());
    let named = match choice {
        None => return Ok(None),
        Some(Value::String(s)) => match s.to_ascii_lowercase().as_str() {
            "auto" | "none" => return Ok(None),
            "required" => None,
            _ => {
                return Err(format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or a function, not {s:?}"
                ))
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str);
            let Some(name) = name else {
                return Err("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}".into());
            };
            Some(name.to_string())
        }
    };
    let Some(name) = named else {
        if tools.is_empty() {
            return Err("Tools cannot be empty if tool choice is set to required.".into());
        }
        let (name, parameters) = pick(&tools, last_user_text(body.get("messages")).as_deref());
        return Ok(Some(ForcedTool {
            name,
            parameters,
            required: true,
        }));
    };
    if tools.is_empty() {
        return Err("Tools cannot be empty if tool choice is set to a specific tool.".into());
    }
    let Some((_, parameters)) = tools.iter().find(|(n, _)| *n == name) else {
        return Err(format!("Tool '{name}' not found in tools list."));
    };
    Ok(Some(ForcedTool {
        parameters: parameters.clone(),
        name,
        required: false,
    }))
}

/// With `"required"`, the tool a model would pick: the first whose name the last user
/// message mentions (`get_weather` for "weather"), else the first.
fn pick(tools: &[(String, Value)], question: Option<&str>) -> (String, Value) {
    let question = question.unwrap_or_default().to_lowercase();
    let mentioned = tools.iter().find(|(name, _)| {
        name.to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .any(|word| word.len() > 3 && question.contains(word))
    });
    mentioned
        .or_else(|| tools.first())
        .cloned()
        .unwrap_or_else(|| (String::new(), Value::Null))
}

/// The text of a message's `content`: a string, or its text parts joined by spaces (as
/// SGLang flattens a tool message's parts).
fn content_text(message: &Value) -> Option<String> {
    match message.get("content")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Value::as_str)))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

fn last_user_text(messages: Option<&Value>) -> Option<String> {
    let messages = messages?.as_array()?;
    let last = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    content_text(last)
}

fn tool_result(messages: Option<&Value>) -> Option<String> {
    let last = messages?.as_array()?.last()?;
    (last.get("role").and_then(Value::as_str) == Some("tool"))
        .then(|| content_text(last).unwrap_or_default())
}

fn format(value: Option<&Value>) -> Result<Option<Format>, String> {
    let Some(format) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => {
            // SGLang also takes the schema beside `type` (`set_json_schema`).
            let schema = format
                .get("json_schema")
                .filter(|j| !j.is_null())
                .map_or_else(|| format.get("schema"), |j| j.get("schema"))
                .filter(|s| !s.is_null());
            match schema {
                Some(schema) if schema.is_object() || schema.is_boolean() => {
                    Ok(Some(Format::JsonSchema(schema.clone())))
                }
                Some(_) => {
                    Err("response_format.json_schema.schema must be a JSON schema object".into())
                }
                None => Err("schema_ is required for json_schema response format request.".into()),
            }
        }
        // Structural tags constrain to forms the sim does not model: answered as text.
        Some("structural_tag") => Ok(None),
        _ => {
            Err("response_format.type must be \"text\", \"json_object\" or \"json_schema\"".into())
        }
    }
}

/// `chat_template_kwargs.enable_thinking`, else what `reasoning_effort` implies (SGLang sets
/// `enable_thinking` to `effort != "none"` unless the request set it).
fn enable_thinking(body: &Value) -> Result<Option<bool>, String> {
    let kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map),
        Some(_) => return Err("chat_template_kwargs must be an object".into()),
    };
    if let Some(value) = kwargs
        .and_then(|k| k.get("enable_thinking"))
        .filter(|v| !v.is_null())
    {
        return Ok(Some(truthy(value)));
    }
    Ok(match body.get("reasoning_effort") {
        Some(Value::String(effort)) => Some(effort != "none"),
        _ => None,
    })
}

/// Jinja's truthiness of a template argument.
fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(extra: Value) -> Result<Options, String> {
        let mut body =
            json!({"messages": [{"role": "user", "content": "What is the weather in Paris?"}]});
        if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
            map.extend(extra);
        }
        parse(Api::Chat, &body)
    }

    #[test]
    fn defaults_and_simple_fields() {
        let o = chat(json!({})).unwrap();
        assert_eq!((o.n, o.stop.len(), o.logprobs), (1, 0, None));
        assert!(o.separate_reasoning && o.tool.is_none() && o.format.is_none());
        let o = chat(json!({"n": 3, "stop": ["a", "", "b"], "logprobs": true, "top_logprobs": 2}))
            .unwrap();
        assert_eq!(
            (o.n, o.stop, o.logprobs),
            (3, vec!["a".to_string(), "b".into()], Some(2))
        );
        assert_eq!(chat(json!({"top_logprobs": 2})).unwrap().logprobs, None);
        assert!(chat(json!({"n": 0})).is_err());
        assert!(chat(json!({"stop": [1]})).is_err());
        assert!(chat(json!({"logprobs": true, "top_logprobs": 21})).is_err());
        let c = parse(Api::Completions, &json!({"prompt": "x", "logprobs": 0})).unwrap();
        assert_eq!(c.logprobs, Some(0));
    }

    #[test]
    fn tool_choice_is_checked_as_sglang_checks_it() {
        let tools = json!([
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
        ]);
        let o = chat(json!({"tools": tools, "tool_choice": "required"})).unwrap();
        let tool = o.tool.unwrap();
        assert_eq!((tool.name.as_str(), tool.required), ("get_weather", true));
        let named = json!({"type": "function", "function": {"name": "get_time"}});
        let tool = chat(json!({"tools": tools, "tool_choice": named}))
            .unwrap()
            .tool
            .unwrap();
        assert_eq!((tool.name.as_str(), tool.required), ("get_time", false));
        assert!(chat(json!({"tools": tools, "tool_choice": "auto"}))
            .unwrap()
            .tool
            .is_none());
        assert_eq!(
            chat(json!({"tool_choice": "required"})).unwrap_err(),
            "Tools cannot be empty if tool choice is set to required."
        );
        let missing = json!({"type": "function", "function": {"name": "nope"}});
        assert_eq!(
            chat(json!({"tools": tools, "tool_choice": missing})).unwrap_err(),
            "Tool 'nope' not found in tools list."
        );
    }

    #[test]
    fn formats_thinking_and_tool_results() {
        let f = chat(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}}),
        );
        assert!(matches!(f.unwrap().format, Some(Format::JsonSchema(_))));
        let f =
            chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}));
        assert_eq!(
            f.unwrap_err(),
            "schema_ is required for json_schema response format request."
        );
        assert!(matches!(
            chat(json!({"response_format": {"type": "json_object"}}))
                .unwrap()
                .format,
            Some(Format::JsonObject)
        ));
        assert!(chat(json!({"response_format": {"type": "xml"}})).is_err());
        let off = chat(json!({"chat_template_kwargs": {"enable_thinking": false}})).unwrap();
        assert_eq!(off.enable_thinking, Some(false));
        assert_eq!(
            chat(json!({"reasoning_effort": "none"}))
                .unwrap()
                .enable_thinking,
            Some(false)
        );
        assert_eq!(chat(json!({})).unwrap().enable_thinking, None);
        let body = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": [{"type": "text", "text": "22 C"}]}]});
        assert_eq!(
            parse(Api::Chat, &body).unwrap().tool_result.as_deref(),
            Some("22 C")
        );
    }
}
