//! The chat completions request a `/v1/responses` request becomes, as sglang 0.5.23 builds
//! it (`OpenAIServingResponses._make_request`, `serving_responses.py`), so a Responses
//! request's prompt is prepared, rendered and counted exactly as that chat
//! ([`ChatRules::Sglang`](super::ChatRules::Sglang)).
//!
//! [`ResponsesPrompt::parse`] reads the request fields that shape the prompt as SGLang's
//! request model does (`ResponsesRequest`, `protocol.py`, with its validators
//! `normalize_reasoning_to_thinking` and `normalize_responses_input`, `ResponseTool`'s dump
//! and `effective_tool_choice`); [`ResponsesPrompt::refusal`] gives `create_responses`'
//! checks on tools and `tool_choice`; [`ResponsesPrompt::to_chat`] builds the chat:
//! `instructions` as a system message, the stored conversation of `previous_response_id`
//! and the new input converted item by item (`responses_items.rs`), function tools as chat
//! tools (`_response_tools_to_chat_tools`, `_chat_tool_choice`), `max_output_tokens - 2` as
//! the budget and `text.format` as a JSON constraint (`to_sampling_params`).
//! [`responses_to_chat`] does all three.
//!
//! The engine-side rest (the store, `background`, the model name, the response object and
//! its events) belongs to whoever serves the response: the simulated engine, or the gateway
//! that routes it.
//!
//! `custom` tools and `custom_tool_call` input items are not served: the tool is left out
//! and the item refused as an unsupported type.

use serde_json::{json, Map, Value};

use super::fields::{self, get, kind, opt_int, opt_object, opt_str, py_repr};
use super::responses_items::{chat_message, coalesce_system, merge_assistants};
// `ReasoningEffortTier` is the chat's `ReasoningEffortType`.
use super::sglang::EFFORT_TIERS as EFFORTS;

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

/// Why SGLang refuses a Responses request: `Invalid` is the request model's validation
/// error (answered as FastAPI's validation error), `Refused` one of `create_responses`'
/// checks (a 400 `invalid_request_error` naming `param`), `Unconvertible` a `ValueError` of
/// `_make_request` (a 400 whose message is `f"{e} {e.__cause__}"`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponsesError {
    /// The request model refused a field.
    #[error("{0}")]
    Invalid(String),
    /// `create_responses` refused the request before building the prompt.
    #[error("{message}")]
    Refused {
        /// SGLang's message.
        message: String,
        /// The field the error names (`param`), if any.
        param: Option<&'static str>,
    },
    /// The input could not become a chat.
    #[error("{0} None")]
    Unconvertible(String),
}

/// The fields of a `/v1/responses` request that shape its prompt, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesPrompt {
    /// `input`: a string, or the list of items (a replayed output item's `id` dropped).
    pub input: Value,
    /// `instructions`.
    pub instructions: Option<String>,
    /// `tools`, dumped as `ResponseTool` dumps them (defaults filled in).
    pub tools: Vec<Value>,
    /// `tool_choice` as given (default `"auto"`).
    pub tool_choice: Value,
    /// `parallel_tool_calls` (default true).
    pub parallel_tool_calls: bool,
    /// `reasoning.effort` and `reasoning.summary`, when `reasoning` was given (an absent
    /// effort is `"medium"`).
    pub reasoning: Option<(Option<String>, Option<String>)>,
    /// `chat_template_kwargs`, with `normalize_reasoning_to_thinking`'s defaults.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// `max_output_tokens`.
    pub max_output_tokens: Option<i64>,
    /// `text` (its `format` constrains the answer).
    pub text: Option<Value>,
}

/// The chat completions request a Responses request becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesChat {
    /// `messages` (an array).
    pub messages: Value,
    /// The function tools as chat tools (None when there are none).
    pub tools: Option<Value>,
    /// The other fields that reach the chat: `tool_choice`, `parallel_tool_calls`,
    /// `reasoning_effort`, `chat_template_kwargs`, `max_tokens`, `response_format`.
    pub fields: Map<String, Value>,
}

impl ResponsesChat {
    /// The chat as a [`ChatRequest`](super::ChatRequest), to prepare and count.
    pub fn request(&self) -> super::ChatRequest<'_> {
        super::ChatRequest {
            messages: &self.messages,
            tools: self.tools.as_ref(),
            fields: &self.fields,
        }
    }

    /// The chat as one chat completions body.
    pub fn into_body(self) -> Map<String, Value> {
        let mut body = self.fields;
        body.insert("messages".into(), self.messages);
        if let Some(tools) = self.tools {
            body.insert("tools".into(), tools);
        }
        body
    }
}

/// `body` (a `/v1/responses` request) as the chat SGLang builds from it, after the
/// conversation stored for its `previous_response_id` (`stored_history`, empty when none);
/// `inline_system`: the template renders a system message after the first turn
/// ([`crate::ModelTokenizer::inline_system_support`]).
///
/// `max_output_tokens` below 2 is not refused here: SGLang refuses it only when sampling
/// (a 400, or a failed stream), see [`ResponsesPrompt::max_tokens_error`].
pub fn responses_to_chat(
    body: &Map<String, Value>,
    stored_history: Vec<Value>,
    inline_system: bool,
) -> Result<ResponsesChat, ResponsesError> {
    let prompt = ResponsesPrompt::parse(body).map_err(ResponsesError::Invalid)?;
    if let Some(refusal) = prompt.refusal() {
        return Err(refusal);
    }
    let history = prompt.history(stored_history);
    prompt
        .to_chat(&history, inline_system)
        .map_err(ResponsesError::Unconvertible)
}

impl ResponsesPrompt {
    /// The request model's checks of the prompt's fields: `Err` is a validation error's text.
    pub fn parse(body: &Map<String, Value>) -> Result<Self, String> {
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
            Some(v) => return Err(fields::wrong("tools", "a valid list", v)),
        };
        let tool_choice = match body.get("tool_choice") {
            None => json!("auto"),
            Some(Value::String(s)) if ["auto", "required", "none"].contains(&s.as_str()) => {
                json!(s)
            }
            Some(v @ Value::Object(_)) => v.clone(),
            Some(_) => {
                return Err(
                    "tool_choice: Input should be 'auto', 'required', 'none' or a dictionary"
                        .into(),
                )
            }
        };
        let reasoning = opt_object(body, "reasoning")?.map(reasoning).transpose()?;
        let mut chat_template_kwargs = opt_object(body, "chat_template_kwargs")?.cloned();
        // `normalize_reasoning_to_thinking`: effort "none" switches thinking off, unless
        // the client's own kwargs say otherwise.
        if matches!(&reasoning, Some((Some(e), _)) if e == "none") {
            let mut kwargs = Map::new();
            kwargs.insert("thinking".into(), json!(false));
            kwargs.insert("enable_thinking".into(), json!(false));
            kwargs.extend(chat_template_kwargs.unwrap_or_default());
            chat_template_kwargs = Some(kwargs);
        }
        let text = opt_object(body, "text")?.map(|t| Value::Object(t.clone()));
        Ok(Self {
            input,
            instructions: opt_str(body, "instructions")?.map(str::to_string),
            tools,
            tool_choice,
            parallel_tool_calls: fields::flag(body, "parallel_tool_calls", true)?,
            reasoning,
            chat_template_kwargs,
            max_output_tokens: opt_int(body, "max_output_tokens")?,
            text,
        })
    }

    /// `effective_tool_choice`: a named function or custom tool, or the string as given;
    /// any other object (built-in tools) is `"auto"`.
    pub fn effective_tool_choice(&self) -> Value {
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

    /// `create_responses`' checks of the tools and `tool_choice`, in its order.
    pub fn refusal(&self) -> Option<ResponsesError> {
        self.shell_refusal().or_else(|| self.tool_choice_refusal())
    }

    /// Shell tools are refused (`create_responses`' first check).
    pub fn shell_refusal(&self) -> Option<ResponsesError> {
        self.tools
            .iter()
            .any(|t| tool_kind(t) == Some("shell"))
            .then(|| refused("Shell tools are not supported by this model", Some("tools")))
    }

    /// A `tool_choice` that forces a tool the request does not declare.
    pub fn tool_choice_refusal(&self) -> Option<ResponsesError> {
        let callable = |t: &&Value| matches!(tool_kind(t), Some("function" | "custom"));
        if self.tool_choice == "required" && !self.tools.iter().any(|t| callable(&t)) {
            return Some(refused(
                "tool_choice=\"required\" requires at least one tool with type=\"function\" or \
                 type=\"custom\"; other built-in tool types cannot be forced.",
                None,
            ));
        }
        let choice = self.effective_tool_choice();
        let name = choice.get("name").and_then(Value::as_str)?;
        let declared = self
            .tools
            .iter()
            .filter(callable)
            .any(|t| t.get("name").and_then(Value::as_str) == Some(name));
        (!declared).then(|| {
            refused(
                &format!("Tool {} is not declared in tools", py_repr(name)),
                Some("tool_choice"),
            )
        })
    }

    /// `SamplingParams.verify` on `max_output_tokens - 2`: the error when it is below 0.
    pub fn max_tokens_error(&self) -> Option<String> {
        self.max_output_tokens
            .filter(|&m| m < 2)
            .map(|m| format!("max_new_tokens must be at least 0, got {}.", m - 2))
    }

    /// The tools the chat sees: each function tool (`_response_tools_to_chat_tools`).
    pub fn chat_tools(&self) -> Vec<Value> {
        self.tools
            .iter()
            .filter(|t| tool_kind(t) == Some("function"))
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.get("name"), "description": t.get("description"),
                    "parameters": t.get("parameters"), "strict": t.get("strict"),
                }})
            })
            .collect()
    }

    /// The conversation so far: the stored one, then this request's input
    /// (`_response_input_history`).
    pub fn history(&self, stored: Vec<Value>) -> Vec<Value> {
        let mut history = stored;
        match &self.input {
            Value::String(s) => history.push(json!({"role": "user", "content": s})),
            Value::Array(items) => history.extend(items.iter().cloned()),
            _ => {}
        }
        history
    }

    /// The chat of `history` (see [`ResponsesPrompt::history`]); `Err`: SGLang's
    /// `ValueError` text.
    pub fn to_chat(&self, history: &[Value], inline_system: bool) -> Result<ResponsesChat, String> {
        let mut messages = Vec::new();
        if let Some(instructions) = self.instructions.as_deref().filter(|i| !i.is_empty()) {
            messages.push(json!({"role": "system", "content": instructions}));
        }
        for item in history {
            if let Some(message) = chat_message(item)? {
                messages.push(message);
            }
        }
        let messages = merge_assistants(messages);
        let messages = if inline_system {
            messages
        } else {
            coalesce_system(messages)
        };
        let mut fields = Map::new();
        let tools = self.chat_tools();
        let tools = if tools.is_empty() {
            fields.insert("tool_choice".into(), json!("none"));
            None
        } else {
            let choice = match self.effective_tool_choice() {
                Value::Object(c) => {
                    json!({"type": "function", "function": {"name": c.get("name")}})
                }
                other => other,
            };
            fields.insert("tool_choice".into(), choice);
            Some(Value::Array(tools))
        };
        fields.insert(
            "parallel_tool_calls".into(),
            json!(self.parallel_tool_calls),
        );
        if let Some((Some(effort), _)) = &self.reasoning {
            fields.insert("reasoning_effort".into(), json!(effort));
        }
        if let Some(kwargs) = &self.chat_template_kwargs {
            fields.insert("chat_template_kwargs".into(), Value::Object(kwargs.clone()));
        }
        if let Some(max) = self.max_output_tokens {
            // `to_sampling_params`: two tokens of headroom for BOS/EOS.
            fields.insert("max_tokens".into(), json!(max.saturating_sub(2).max(0)));
        }
        if let Some(format) = self.json_format() {
            fields.insert("response_format".into(), format.clone());
        }
        Ok(ResponsesChat {
            messages: Value::Array(messages),
            tools,
            fields,
        })
    }

    /// `_json_schema_from_text_format`: `text.format` constrains the answer to JSON, as a
    /// chat's `response_format` does (a schema given beside `type`).
    fn json_format(&self) -> Option<&Value> {
        let format = self.text.as_ref()?.get("format")?;
        let constrained = match format.get("type").and_then(Value::as_str) {
            Some("json_object") => true,
            Some("json_schema") => format.get("schema").is_some_and(|s| !s.is_null()),
            _ => false,
        };
        constrained.then_some(format)
    }
}

fn refused(message: &str, param: Option<&'static str>) -> ResponsesError {
    ResponsesError::Refused {
        message: message.to_string(),
        param,
    }
}

fn tool_kind(tool: &Value) -> Option<&str> {
    tool.get("type").and_then(Value::as_str)
}

/// `reasoning`'s `effort` and `summary`.
fn reasoning(r: &Map<String, Value>) -> Result<(Option<String>, Option<String>), String> {
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
            return Err("reasoning.summary: Input should be 'auto', 'concise' or 'detailed'".into())
        }
    };
    Ok((effort, summary))
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
        return Err(fields::wrong(
            &format!("tools.{i}"),
            "a valid dictionary",
            value,
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

#[cfg(test)]
#[path = "responses_tests.rs"]
mod tests;
