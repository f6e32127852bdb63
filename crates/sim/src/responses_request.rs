//! A `/v1/responses` request as SGLang reads it (sglang 0.5.23): its model
//! (`ResponsesRequest`, `protocol.py`). The fields that shape the prompt, and the chat they
//! become, are read and built by `kvgate_tokenize::prepare::responses` (shared with the
//! gateway, which counts the same prompt); this module reads the rest: the response's id,
//! `store`, `stream`, `background`, `include`, and the fields a response echoes.

use serde_json::{json, Map, Value};

use super::errors::kind;
use super::fields::{self, get, opt_f64, opt_object, opt_str};
use super::request::random_hex;
use kvgate_tokenize::prepare::ResponsesPrompt;

/// The reasoning effort tiers a response echoes (`ECHOABLE_REASONING_EFFORTS`).
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
    /// The fields that shape the prompt.
    pub(crate) prompt: ResponsesPrompt,
    pub(crate) previous_response_id: Option<String>,
    /// `store` (default true; `null` is kept as `None`, which stores nothing).
    pub(crate) store: Option<bool>,
    pub(crate) stream: bool,
    pub(crate) background: bool,
    pub(crate) include_logprobs: bool,
    /// Echoed as given: `temperature`, `top_p`, `text`, `truncation`, `user`, `metadata`.
    pub(crate) echo: Map<String, Value>,
    /// Passed to the generation as given: `stop` and the PD / cache fields.
    pub(crate) passed: Map<String, Value>,
}

impl ResponsesRequest {
    /// The `reasoning` a response echoes.
    pub(crate) fn reasoning_echo(&self) -> Value {
        let effort = self
            .prompt
            .reasoning
            .as_ref()
            .and_then(|(effort, _)| effort.as_deref())
            .filter(|e| ECHOABLE.contains(e));
        json!({"effort": effort, "summary": null})
    }

    /// `reasoning.summary` was asked for.
    pub(crate) fn wants_summary(&self) -> bool {
        matches!(&self.prompt.reasoning, Some((_, Some(_))))
    }

    /// The chat completions body the request becomes, after `history` (the stored
    /// conversation and this input); `Err`: SGLang's `ValueError` text.
    pub(crate) fn chat_body(
        &self,
        history: &[Value],
        inline_system: bool,
    ) -> Result<Map<String, Value>, String> {
        let mut body = self.prompt.to_chat(history, inline_system)?.into_body();
        body.insert("stream".into(), json!(self.stream));
        body.insert("rid".into(), json!(self.id));
        body.extend(self.passed.clone());
        Ok(body)
    }
}

/// The request model's checks: `Err` is a validation error's text.
pub(crate) fn parse(body: &Map<String, Value>) -> Result<ResponsesRequest, String> {
    let prompt = ResponsesPrompt::parse(body)?;
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
    if let Some(v) = get(body, "truncation") {
        if !v.as_str().is_some_and(|t| t == "auto" || t == "disabled") {
            return Err("truncation: Input should be 'auto' or 'disabled'".into());
        }
    }
    opt_f64(body, "temperature")?;
    opt_f64(body, "top_p")?;
    opt_object(body, "metadata")?;
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
        prompt,
        previous_response_id: opt_str(body, "previous_response_id")?.map(str::to_string),
        store,
        stream: fields::flag(body, "stream", false)?,
        background: fields::flag(body, "background", false)?,
        include_logprobs,
        echo,
        passed,
    })
}
