//! A chat prepared and rendered as the serving engine does (`kvgate_tokenize::prepare`),
//! and what the client is told when the engine would refuse it.

use serde_json::Value;

use crate::error::GatewayError;
use kvgate_tokenize::prepare::{responses_to_chat, ResponsesChat, ResponsesError, ResponsesPrompt};
use kvgate_tokenize::{
    ChatPrompt, ChatRequest, ChatRules, ModelInput, ModelTokenizer, MultimodalPrompt, TokenizeError,
};

/// A chat the engine would not render, as the client's 400: the engine's own refusal, or
/// the template's own message (its `raise_exception`), naming the model.
fn template_error(model: &str, e: TokenizeError) -> GatewayError {
    match e {
        TokenizeError::NoChatTemplate => GatewayError::invalid(
            format!("model `{model}` has no chat template; use /v1/completions or /generate"),
            Some("messages"),
        ),
        TokenizeError::Refused(m) => GatewayError::invalid(m, Some("messages")),
        TokenizeError::TemplateRaised(m) => GatewayError::invalid(
            format!("the chat template of model `{model}` refused these messages: {m}"),
            Some("messages"),
        ),
        other => GatewayError::invalid(
            format!(
                "the chat template of model `{model}` could not render these messages: {other}"
            ),
            Some("messages"),
        ),
    }
}

/// A chat prepared by `rules` and rendered (the request's prompt fields were checked by
/// parsing).
pub fn render_chat(
    tokenizer: &ModelTokenizer,
    model: &str,
    rules: ChatRules,
    messages: &str,
    tools: Option<&str>,
    fields: &serde_json::Map<String, Value>,
) -> Result<ChatPrompt, GatewayError> {
    let messages: Value = parse_raw(messages, "messages")?;
    let tools: Option<Value> = tools.map(|t| parse_raw(t, "tools")).transpose()?;
    let request = ChatRequest {
        messages: &messages,
        tools: tools.as_ref(),
        fields,
    };
    tokenizer
        .chat_prompt(rules, &request)
        .map_err(|e| template_error(model, e))
}

/// A chat with images for a vision model, prepared by SGLang's rules (media parts reach the
/// template as placeholders, listed in render order) and rendered; the placeholders are
/// expanded by the caller (`vision::expand_images`).
pub fn render_chat_with_media(
    tokenizer: &ModelTokenizer,
    model: &str,
    rules: ChatRules,
    messages: &Value,
    tools: Option<&str>,
    fields: &serde_json::Map<String, Value>,
) -> Result<MultimodalPrompt, GatewayError> {
    let tools: Option<Value> = tools.map(|t| parse_raw(t, "tools")).transpose()?;
    let request = ChatRequest {
        messages,
        tools: tools.as_ref(),
        fields,
    };
    tokenizer
        .chat_prompt_with_media(rules, &request, ModelInput::Multimodal)
        .map_err(|e| template_error(model, e))
}

/// A raw field (`api::raw`) as values; it was parsed once already, so this only fails
/// when nesting is too deep for a value tree.
pub(super) fn parse_raw(raw: &str, field: &str) -> Result<Value, GatewayError> {
    serde_json::from_str(raw).map_err(|e| {
        GatewayError::invalid(format!("`{field}` could not be read: {e}"), Some(field))
    })
}

/// A `/v1/responses` request as the chat SGLang builds from it (sglang 0.5.23
/// `serving_responses.py` `_make_request`, through `kvgate_tokenize::prepare::responses`),
/// prepared and rendered by SGLang's rules. A `previous_response_id`'s stored conversation
/// lives only in the engine that holds it: what is counted here is the new part, a lower
/// bound of the engine's prompt (`stack::responses` says how that stays fail-closed).
pub fn render_responses(
    tokenizer: &ModelTokenizer,
    model: &str,
    fields: &serde_json::Map<String, Value>,
) -> Result<ChatPrompt, GatewayError> {
    let chat = responses_chat(tokenizer, fields)?;
    tokenizer
        .chat_prompt(ChatRules::Sglang, &chat.request())
        .map_err(|e| template_error(model, e))
}

/// [`render_responses`] for a vision model: its `input_image` parts (image parts of the
/// chat) reach the template as placeholders, listed in render order.
pub fn render_responses_with_media(
    tokenizer: &ModelTokenizer,
    model: &str,
    fields: &serde_json::Map<String, Value>,
) -> Result<MultimodalPrompt, GatewayError> {
    let chat = responses_chat(tokenizer, fields)?;
    tokenizer
        .chat_prompt_with_media(ChatRules::Sglang, &chat.request(), ModelInput::Multimodal)
        .map_err(|e| template_error(model, e))
}

/// The chat SGLang builds from a `/v1/responses` request, after kvgate's own refusals.
pub(super) fn responses_chat(
    tokenizer: &ModelTokenizer,
    fields: &serde_json::Map<String, Value>,
) -> Result<ResponsesChat, GatewayError> {
    let refused = |e: ResponsesError| match e {
        ResponsesError::Refused { message, param } => GatewayError::invalid(message, param),
        other => GatewayError::invalid(other.to_string(), Some("input")),
    };
    // Built-in tools (web search, code interpreter, MCP servers, shells) run inside the
    // engine's own tool loop: prompt text nobody counted, and connections a tenant would
    // choose. Only function tools, which the client runs, are served.
    if let Some(Value::Array(tools)) = fields.get("tools") {
        if let Some((i, kind)) = tools.iter().enumerate().find_map(|(i, t)| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
            (kind != "function").then(|| (i, kind.to_owned()))
        }) {
            return Err(GatewayError::invalid(
                format!(
                    "tools[{i}] has type `{kind}`: only `function` tools are served through kvgate (built-in tools run inside the engine, where the gateway cannot count or bound them)"
                ),
                Some("tools"),
            ));
        }
    }
    // SGLang refuses a budget below its two reserved tokens only when it samples; the
    // gateway refuses it at once.
    if let Some(message) = ResponsesPrompt::parse(fields)
        .ok()
        .and_then(|p| p.max_tokens_error())
    {
        return Err(GatewayError::invalid(message, Some("max_output_tokens")));
    }
    responses_to_chat(fields, Vec::new(), tokenizer.inline_system_support()).map_err(refused)
}
