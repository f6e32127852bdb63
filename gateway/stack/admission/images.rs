//! A chat's images, read before it is counted (`crate::vision`): only for a vision model's
//! chat that names an image.

use std::sync::Arc;

use super::chat;
use super::{ModelAdmission, PoolBudget};
use crate::error::GatewayError;
use crate::stack::api::{InferenceRequest, PromptInput};
use crate::vision::{resolve_images, ModelVision, ResolvedImages};

/// A vision model's chat with images: its messages, parsed, and the size of each image they
/// name (read from its header: inline, or fetched through the first candidate pool that
/// fetches remote images). None for every other request.
pub(super) async fn chat_images(
    model: &ModelAdmission,
    parsed: &InferenceRequest,
    budgets: &[PoolBudget],
) -> Result<
    Option<(
        serde_json::Value,
        ResolvedImages,
        Arc<ModelVision>,
        Option<u32>,
    )>,
    GatewayError,
> {
    let Some((vision, token)) = &model.vision else {
        return Ok(None);
    };
    let messages = match parsed.prompts()?.into_iter().next() {
        // Most chats have no image: no second parse for them.
        Some(PromptInput::Chat { messages, .. }) if messages.contains("\"image_url\"") => {
            chat::parse_raw(messages, "messages")?
        }
        // A Responses request's `input_image` parts are the chat's image parts.
        Some(PromptInput::Responses(fields))
            if fields
                .get("input")
                .is_some_and(|i| i.to_string().contains("\"input_image\"")) =>
        {
            chat::responses_chat(&model.tokenizer, fields)?.messages
        }
        _ => return Ok(None),
    };
    let pools: Vec<&str> = budgets.iter().map(|b| &*b.pool).collect();
    let resolved = resolve_images(vision, &parsed.model, &messages, &pools)
        .await
        .map_err(|e| GatewayError::invalid(e.to_string(), Some(e.param())))?;
    if resolved.is_empty() {
        return Ok(None);
    }
    Ok(Some((messages, resolved, vision.clone(), *token)))
}
