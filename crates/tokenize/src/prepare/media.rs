//! Media content parts (`image_url`, `video_url`, `audio_url`) of a chat for a multimodal
//! model, as SGLang prepares them before its template renders the chat.
//!
//! Read from sglang 0.5.23:
//! - `entrypoints/openai/serving_chat.py` `validate_media_content`: a model that is not
//!   multimodal refuses any such part ("Model only supports text input; ..."); a
//!   multimodal one lets every kind through to its processor;
//! - `protocol.py` `ChatCompletionMessageContentImagePart` (and the video and audio ones):
//!   `{"type": "image_url", "image_url": {"url": str, "detail": "auto" | "low" | "high"}}`;
//! - `parser/jinja_template_utils.py` `process_content_for_template_format`: for an
//!   "openai" template each media part becomes `{"type": "image"}` (`"video"`, `"audio"`)
//!   and its url is collected, in message order, into the request's image (video, audio)
//!   data; a "string" template gets the text parts joined and no media at all.
//!
//! What the processor then makes of each item (its placeholder expanded to the item's
//! tokens) is the model's business, not the preparation's: the engine (or kvgate's
//! counter) takes [`MultimodalPrompt::media`] and expands the placeholders itself.

use serde_json::{Map, Value};

use super::{refused, ChatPrompt};
use crate::TokenizeError;

/// What the served model takes besides text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ModelInput {
    /// A text-only model: media parts are refused (SGLang's `validate_media_content`).
    #[default]
    TextOnly,
    /// A multimodal model: media parts reach the template as placeholders.
    Multimodal,
}

/// The kind of a media part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediaKind {
    /// `image_url`
    Image,
    /// `video_url`
    Video,
    /// `audio_url`
    Audio,
}

impl MediaKind {
    /// The kind of a content part's `type`, when it is a media part.
    pub fn of_part_type(part_type: &str) -> Option<Self> {
        match part_type {
            "image_url" => Some(MediaKind::Image),
            "video_url" => Some(MediaKind::Video),
            "audio_url" => Some(MediaKind::Audio),
            _ => None,
        }
    }

    /// The part's `type` in the request (`image_url`, ...), also the key of its object.
    pub fn part_type(self) -> &'static str {
        match self {
            MediaKind::Image => "image_url",
            MediaKind::Video => "video_url",
            MediaKind::Audio => "audio_url",
        }
    }

    /// The part's `type` as the template sees it (`image`, `video`, `audio`).
    pub fn template_type(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Video => "video",
            MediaKind::Audio => "audio",
        }
    }
}

/// One media part of a chat, in the order the template renders its placeholder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaPart {
    /// Image, video or audio.
    pub kind: MediaKind,
    /// The part's `url`: a `data:` URL, an `http(s)://` URL, a path or raw base64, as
    /// the client sent it (the engine loads it).
    pub url: String,
    /// An image's `detail` (`auto`, `low`, `high`), when the client gave one.
    pub detail: Option<String>,
}

/// A chat's prompt whose render holds one placeholder per media part, with those parts in
/// render order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultimodalPrompt {
    /// The rendered prompt, placeholders not yet expanded.
    pub prompt: ChatPrompt,
    /// The media parts whose placeholders the render holds, in order (empty for a
    /// text-only chat and for a "string" template, which drops media as SGLang does).
    pub media: Vec<MediaPart>,
}

/// The text-only refusal of a media part (`validate_media_content`).
pub(super) fn text_only_refusal(part_type: &str) -> TokenizeError {
    refused(format!(
        "Model only supports text input; received unsupported content type '{part_type}'."
    ))
}

/// A media part as the request model dumps it (`{type, <type>: {url, detail}}`), checked
/// as SGLang's part models check it; refused outright for a text-only model.
pub(super) fn dump_part(
    i: usize,
    j: usize,
    kind: MediaKind,
    part: &Value,
    input: ModelInput,
) -> Result<Value, TokenizeError> {
    if input == ModelInput::TextOnly {
        return Err(text_only_refusal(kind.part_type()));
    }
    let key = kind.part_type();
    let invalid = |what: &str| refused(format!("messages[{i}].content[{j}]: {what}"));
    let Some(Value::Object(object)) = part.get(key) else {
        return Err(invalid(&format!("a {key} part needs a `{key}` object")));
    };
    let Some(Value::String(url)) = object.get("url") else {
        return Err(invalid(&format!("`{key}.url` must be a string")));
    };
    let mut inner = Map::new();
    inner.insert("url".into(), Value::from(url.as_str()));
    if kind == MediaKind::Image {
        match object.get("detail") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) if ["auto", "low", "high"].contains(&d.as_str()) => {
                inner.insert("detail".into(), Value::from(d.as_str()));
            }
            Some(_) => {
                return Err(invalid(
                    "`image_url.detail` must be one of 'auto', 'low', 'high'",
                ))
            }
        }
    }
    let mut out = Map::new();
    out.insert("type".into(), Value::from(key));
    out.insert(key.into(), Value::Object(inner));
    Ok(Value::Object(out))
}

/// A dumped part as an "openai" template sees it: a text part as it is, a media part as
/// `{"type": "image"}` (its item pushed to `media`), anything else (thinking) dropped.
pub(super) fn template_part(part: &Value, media: &mut Vec<MediaPart>) -> Option<Value> {
    let part_type = part.get("type").and_then(Value::as_str)?;
    if part_type == "text" {
        return Some(part.clone());
    }
    let kind = MediaKind::of_part_type(part_type)?;
    let object = part.get(part_type)?;
    media.push(MediaPart {
        kind,
        url: object.get("url").and_then(Value::as_str)?.to_owned(),
        detail: object
            .get("detail")
            .and_then(Value::as_str)
            .map(str::to_owned),
    });
    let mut out = Map::new();
    out.insert("type".into(), Value::from(kind.template_type()));
    Some(Value::Object(out))
}

#[cfg(test)]
mod tests;
