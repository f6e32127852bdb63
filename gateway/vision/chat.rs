//! A chat's images as admission and the local answers (`/tokenize`, `count_tokens`) both
//! need them: read once before the chat is counted, then expanded into its rendered prompt
//! for the pre-resize cap of the pool it is counted for.

use serde_json::Value;
use std::sync::Arc;

use super::{expand_images, metrics, resolve_images, ImageSalts, ModelVision, ResolvedImages};
use crate::error::GatewayError;
use kvgate_tokenize::MultimodalPrompt;

/// Whether raw chat messages may hold an image part: a scan of the text, so that most chats
/// (no image) are never parsed a second time.
pub fn may_hold_images(raw_messages: &str) -> bool {
    raw_messages.contains("\"image_url\"")
}

/// A chat's images, read: the model's vision and image token, the messages (parsed once to
/// find them) and what was read of each image.
#[derive(Debug)]
pub struct ChatImages {
    pub vision: Arc<ModelVision>,
    /// The id of the family's image token (prefix routing salts its runs; a run is written
    /// once in the text), when the tokenizer has it as one token.
    pub image_token: Option<u32>,
    pub messages: Value,
    pub resolved: ResolvedImages,
}

impl ChatImages {
    /// Read every image `messages` names for model `model` (`vision`, and its image token),
    /// for a request that may go to `pools`. None when it names none.
    pub async fn read(
        (vision, image_token): &(Arc<ModelVision>, Option<u32>),
        model: &str,
        messages: Value,
        pools: &[&str],
    ) -> Result<Option<Self>, GatewayError> {
        let resolved = resolve_images(vision, model, &messages, pools)
            .await
            .map_err(|e| GatewayError::invalid(e.to_string(), Some(e.param())))?;
        if resolved.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self {
            vision: vision.clone(),
            image_token: *image_token,
            messages,
            resolved,
        }))
    }

    /// Whether one of the images was fetched from a remote URL.
    pub fn fetched_any(&self) -> bool {
        self.resolved.values().any(|i| i.remote)
    }

    /// Expand `prepared`'s placeholders as engines of pre-resize cap `cap` do; a refusal by
    /// the model's processor (an aspect ratio over 200, say) is the client's 400, counted.
    pub fn expand(
        &self,
        model: &str,
        prepared: &mut MultimodalPrompt,
        cap: Option<u64>,
    ) -> Result<ImageSalts, GatewayError> {
        let processor = self.vision.processor(cap).ok_or_else(|| {
            GatewayError::Internal(format!(
                "model `{model}` has no image processor for its pool"
            ))
        })?;
        expand_images(
            &mut prepared.prompt,
            &prepared.media,
            &self.resolved,
            processor,
            self.image_token,
        )
        .map_err(|m| {
            metrics::refused(model, "processor");
            GatewayError::invalid(m, Some("messages"))
        })
    }
}
