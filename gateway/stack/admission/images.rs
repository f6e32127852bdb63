//! A chat's images, read before it is counted (`crate::vision`): only for a vision model's
//! chat (or Responses request) that names an image.

use serde_json::Value;

use super::chat;
use super::{ModelAdmission, PoolBudget};
use crate::error::GatewayError;
use crate::stack::api::{InferenceRequest, PromptInput};
use crate::vision::{may_hold_images, ChatImages};

/// A vision model's chat with images: its messages, parsed, and the size of each image they
/// name (read from its header: inline, or fetched through the first candidate pool that
/// fetches remote images). None for every other request.
pub(super) async fn chat_images(
    model: &ModelAdmission,
    parsed: &InferenceRequest,
    budgets: &[PoolBudget],
) -> Result<Option<ChatImages>, GatewayError> {
    let Some(vision) = &model.vision else {
        return Ok(None);
    };
    let messages = match parsed.prompts()?.into_iter().next() {
        Some(PromptInput::Chat { messages, .. }) if may_hold_images(messages) => {
            chat::parse_raw(messages, "messages")?
        }
        // A Responses request's `input_image` parts are the chat's image parts.
        Some(PromptInput::Responses(fields))
            if fields.get("input").is_some_and(names_input_image) =>
        {
            chat::responses_chat(&model.tokenizer, fields)?.messages
        }
        _ => return Ok(None),
    };
    let pools: Vec<&str> = budgets.iter().map(|b| &*b.pool).collect();
    ChatImages::read(vision, &parsed.model, messages, &pools).await
}

/// Whether a Responses `input` has an `input_image` part (its items' `content` lists).
fn names_input_image(input: &Value) -> bool {
    input.as_array().is_some_and(|items| {
        items
            .iter()
            .filter_map(|item| item.get("content").and_then(Value::as_array))
            .flatten()
            .any(|part| part.get("type").and_then(Value::as_str) == Some("input_image"))
    })
}
