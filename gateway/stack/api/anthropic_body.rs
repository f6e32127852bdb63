//! An Anthropic Messages body (`/v1/messages`, `/v1/messages/count_tokens`) as the chat
//! completions request it becomes, so parsing can read it as a chat: kvgate's own
//! translation (`crate::anthropic`, the chat the engine will get), or, for a model whose
//! engines serve `/v1/messages` themselves, the chat SGLang builds from the body
//! (`kvgate_tokenize::prepare::anthropic`), only counted and checked: the body goes as it
//! came.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::Endpoint;
use crate::anthropic::{self, AnthropicError};
use crate::error::GatewayError;
use kvgate_tokenize::prepare::anthropic::{
    sglang_count_tokens_chat, sglang_messages_chat, AnthropicChatError,
};

/// The chat `body` becomes, encoded; `to_engine`: the engine builds it.
pub(super) fn chat_of(
    endpoint: Endpoint,
    body: &Map<String, Value>,
    to_engine: bool,
) -> Result<Bytes, GatewayError> {
    let chat = if to_engine {
        engine_chat(endpoint, body)?
    } else {
        match endpoint {
            Endpoint::CountTokens => anthropic::count_tokens_to_chat(body),
            _ => anthropic::to_chat(body),
        }
        .map_err(|e| match e {
            AnthropicError::InvalidRequest { path, message } => {
                GatewayError::invalid(format!("{path}: {message}"), Some(&path))
            }
            AnthropicError::Unsupported { path, reason } => {
                GatewayError::invalid(format!("{path}: {reason}"), Some(&path))
            }
            other => GatewayError::invalid(other.to_string(), None),
        })?
    };
    serde_json::to_vec(&chat)
        .map(Bytes::from)
        .map_err(|e| GatewayError::Internal(format!("encoding the translated chat: {e}")))
}

/// The chat SGLang's `/v1/messages` (or its `count_tokens`) builds from `body`; a shape
/// whose prompt depends on the SGLang version or its flags is refused by name.
fn engine_chat(
    endpoint: Endpoint,
    body: &Map<String, Value>,
) -> Result<Map<String, Value>, GatewayError> {
    let chat = match endpoint {
        Endpoint::CountTokens => sglang_count_tokens_chat(body),
        _ => sglang_messages_chat(body),
    };
    let mut chat = chat.map_err(|e| match e {
        AnthropicChatError::Invalid { path, message } => {
            GatewayError::invalid(format!("{path}: {message}"), Some(&path))
        }
        AnthropicChatError::Unsupported { path, reason } => GatewayError::invalid(
            format!(
                "{path}: {reason} (this model's Anthropic requests go to the engine as they are; kvgate refuses what it cannot count exactly)"
            ),
            Some(&path),
        ),
    })?;
    // Only counted: what SGLang asks of its own chat stage in a stream does not change
    // the prompt.
    chat.remove("stream_options");
    Ok(chat)
}
