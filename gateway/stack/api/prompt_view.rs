//! Borrowed views of a prompt's raw JSON (`api::raw`): what the stages read of it, with no
//! copy of its text unless the client escaped characters in it.
//!
//! The parse stage builds each view once to check the prompt's structure; later stages
//! build it again where they need it (a scan of text already in cache, no allocation for
//! the text itself), which is cheaper than keeping a parsed tree alive for the request.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

use crate::error::GatewayError;

/// A JSON string, borrowed from the body unless it has escapes.
#[derive(Debug, Deserialize)]
#[serde(transparent)]
pub struct Text<'a>(#[serde(borrow)] pub Cow<'a, str>);

/// One chat message, as the gateway reads it (the template reads the whole message).
#[derive(Debug)]
pub struct Message<'a> {
    pub role: Cow<'a, str>,
    pub content: Content<'a>,
}

/// A message's `content`.
#[derive(Debug)]
pub enum Content<'a> {
    /// Absent or `null` (assistant tool calls).
    None,
    /// A string.
    Text(Cow<'a, str>),
    /// Content parts: the text of its text parts (image parts are counted by admission).
    Parts(Vec<Cow<'a, str>>),
    /// Anything else: the template decides what it makes of it.
    Other,
}

#[derive(Deserialize)]
struct MessageShape<'a> {
    #[serde(borrow)]
    role: Text<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct PartShape<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

fn first_byte(raw: &str) -> u8 {
    raw.as_bytes().first().copied().unwrap_or(b' ')
}

fn string_of(raw: &RawValue) -> Option<Cow<'_, str>> {
    (first_byte(raw.get()) == b'"')
        .then(|| {
            serde_json::from_str::<Text<'_>>(raw.get())
                .ok()
                .map(|t| t.0)
        })
        .flatten()
}

/// The messages of a chat (`messages` raw JSON), checked: a non-empty array of objects with a
/// string `role`, whose list contents are text parts only.
pub fn messages(raw: &str) -> Result<Vec<Message<'_>>, GatewayError> {
    // One pass over the text when the shape is right (nearly always); a second, per
    // message, only to say which message is wrong.
    let shapes: Vec<MessageShape<'_>> = match serde_json::from_str(raw) {
        Ok(shapes) => shapes,
        Err(_) => return Err(message_error(raw)),
    };
    if shapes.is_empty() {
        return Err(GatewayError::invalid(
            "`messages` must not be empty",
            Some("messages"),
        ));
    }
    shapes
        .into_iter()
        .enumerate()
        .map(|(i, shape)| {
            Ok(Message {
                role: shape.role.0,
                content: content(i, shape.content)?,
            })
        })
        .collect()
}

/// The error of a `messages` value that is not a list of message objects.
fn message_error(raw: &str) -> GatewayError {
    let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(raw) else {
        return GatewayError::invalid(
            "`messages` must be an array of message objects",
            Some("messages"),
        );
    };
    for (i, item) in items.iter().enumerate() {
        if let Err(e) = serde_json::from_str::<MessageShape<'_>>(item.get()) {
            return GatewayError::invalid(
                format!("messages[{i}] must be an object with a string `role` ({e})"),
                Some("messages"),
            );
        }
    }
    GatewayError::invalid(
        "`messages` must be an array of message objects",
        Some("messages"),
    )
}

/// Chat content is text and images: images are counted for a model with `[models.vision]`
/// (`vision`; a text-only model refuses them as its engine does), while audio and video
/// parts are prompts the gateway cannot count yet, so cannot admit.
fn content(i: usize, raw: Option<&RawValue>) -> Result<Content<'_>, GatewayError> {
    let Some(raw) = raw else {
        return Ok(Content::None);
    };
    match first_byte(raw.get()) {
        b'n' => Ok(Content::None),
        b'"' => Ok(string_of(raw).map_or(Content::Other, Content::Text)),
        b'[' => {
            let parts: Vec<&RawValue> = serde_json::from_str(raw.get()).unwrap_or_default();
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let shape = serde_json::from_str::<PartShape<'_>>(part.get()).ok();
                // Text, and the reasoning of earlier assistant turns (engines drop it or
                // count it as text, each by its own rules in `kvgate_tokenize::prepare`).
                let kind = shape.as_ref().and_then(|s| s.kind).and_then(string_of);
                let is_text = kind
                    .as_deref()
                    .is_some_and(|k| matches!(k, "text" | "thinking" | "reasoning"));
                match kind.as_deref() {
                    _ if is_text => {}
                    // Counted by admission (`vision`); no text for the views.
                    Some("image_url") => continue,
                    Some("video_url" | "audio_url" | "input_audio" | "file") => {
                        return Err(GatewayError::UnsupportedParameter {
                            param: format!("messages[{i}].content[{j}]"),
                            reason: "video, audio and file parts are not counted yet: kvgate admits text and images only",
                        })
                    }
                    _ => {
                        return Err(GatewayError::UnsupportedParameter {
                            param: format!("messages[{i}].content[{j}]"),
                            reason: "a content part must be {\"type\": \"text\", ...} or {\"type\": \"image_url\", ...}",
                        })
                    }
                }
                if kind.as_deref() != Some("text") {
                    continue;
                }
                if let Some(text) = shape.and_then(|s| s.text).and_then(string_of) {
                    texts.push(text);
                }
            }
            Ok(Content::Parts(texts))
        }
        _ => Ok(Content::Other),
    }
}

/// The prompts of a completion or `/generate` request.
#[derive(Debug)]
pub enum Prompts<'a> {
    /// One text per sample.
    Texts(Vec<Cow<'a, str>>),
    /// One token-id list per sample.
    Ids(Vec<Vec<u32>>),
}

impl Prompts<'_> {
    /// The number of samples.
    pub fn len(&self) -> usize {
        match self {
            Prompts::Texts(t) => t.len(),
            Prompts::Ids(ids) => ids.len(),
        }
    }

    /// Whether there are none (never, once checked).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// OpenAI `prompt` and SGLang `text`/`input_ids` (raw JSON of `field`): a string, a list of
/// strings, a list of token ids or a list of non-empty token-id lists.
pub fn prompts<'a>(raw: &'a str, field: &str) -> Result<Prompts<'a>, GatewayError> {
    let bad = || {
        GatewayError::invalid(
            format!("`{field}` must be a string, a list of strings, a list of token ids or a list of token-id lists"),
            Some(field),
        )
    };
    match first_byte(raw) {
        b'"' => {
            let text: Text<'a> = serde_json::from_str(raw).map_err(|_| bad())?;
            return Ok(Prompts::Texts(vec![text.0]));
        }
        b'[' => {}
        _ => return Err(bad()),
    }
    let items: Vec<&'a RawValue> = serde_json::from_str(raw).map_err(|_| bad())?;
    let Some(first) = items.first() else {
        return Err(GatewayError::invalid(
            format!("`{field}` must not be empty"),
            Some(field),
        ));
    };
    match first_byte(first.get()) {
        b'"' => items
            .iter()
            .map(|item| string_of(item).ok_or_else(bad))
            .collect::<Result<_, _>>()
            .map(Prompts::Texts),
        b'[' => items
            .iter()
            .map(|item| match serde_json::from_str::<Vec<u32>>(item.get()) {
                Ok(ids) if !ids.is_empty() => Ok(ids),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()
            .map(Prompts::Ids),
        _ => serde_json::from_str::<Vec<u32>>(raw)
            .map(|ids| Prompts::Ids(vec![ids]))
            .map_err(|_| bad()),
    }
}

/// Whether a checked prompt (raw JSON) is a list of token-id lists (not one list).
pub fn is_nested_ids(raw: &str) -> bool {
    raw.strip_prefix('[')
        .is_some_and(|rest| rest.trim_start().starts_with('['))
}

/// Whether a checked prompt (raw JSON) is token ids rather than text.
pub fn is_token_ids(raw: &str) -> bool {
    let Some(rest) = raw.strip_prefix('[') else {
        return false;
    };
    !rest.trim_start().starts_with('"')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescaped_text_is_borrowed_and_escaped_text_decoded() {
        let raw =
            r#"[{"role":"system","content":"plain"},{"role":"user","content":"a\nb","name":"x"}]"#;
        let m = messages(raw).unwrap();
        assert!(matches!(
            &m[0].content,
            Content::Text(Cow::Borrowed("plain"))
        ));
        assert!(matches!(&m[1].content, Content::Text(Cow::Owned(s)) if s == "a\nb"));
        assert_eq!(m[1].role, "user");
    }

    #[test]
    fn content_parts_must_be_text() {
        let ok = r#"[{"role":"user","content":[{"type":"text","text":"a"},{"type":"t\u0065xt","text":"b"}]}]"#;
        match &messages(ok).unwrap()[0].content {
            Content::Parts(p) => assert_eq!(p, &["a", "b"]),
            other => panic!("{other:?}"),
        }
        // Images pass (admission counts them); they hold no text.
        let image = r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"a"}]}]"#;
        match &messages(image).unwrap()[0].content {
            Content::Parts(p) => assert_eq!(p, &["a"]),
            other => panic!("{other:?}"),
        }
        for bad in [
            r#"[{"role":"user","content":[{"type":"video_url","video_url":{"url":"x"}}]}]"#,
            r#"[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"x"}}]}]"#,
            r#"[{"role":"user","content":["text"]}]"#,
            r#"[{"role":"user","content":[{"text":"no type"}]}]"#,
        ] {
            let err = messages(bad).unwrap_err();
            assert!(
                matches!(err, GatewayError::UnsupportedParameter { ref param, .. } if param == "messages[0].content[0]"),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn the_wrong_message_is_named() {
        let raw = r#"[{"role":"user","content":"a"},{"content":"b"}]"#;
        match messages(raw).unwrap_err() {
            GatewayError::InvalidRequest { message, .. } => {
                assert!(message.starts_with("messages[1]"), "{message}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn malformed_messages_are_invalid() {
        for bad in [
            "{}",
            "[]",
            r#"[{"content":"x"}]"#,
            r#"[{"role":1}]"#,
            r#"["user"]"#,
            r#"[{"role":"user","role":"system"}]"#,
        ] {
            assert!(
                matches!(messages(bad), Err(GatewayError::InvalidRequest { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn prompt_shapes() {
        assert!(matches!(prompts(r#""x""#, "prompt").unwrap(), Prompts::Texts(t) if t == ["x"]));
        assert_eq!(prompts(r#"["a","b"]"#, "prompt").unwrap().len(), 2);
        assert!(
            matches!(prompts("[1, 2,3]", "prompt").unwrap(), Prompts::Ids(ids) if ids == [vec![1, 2, 3]])
        );
        assert!(
            matches!(prompts("[[1],[2,3]]", "prompt").unwrap(), Prompts::Ids(ids) if ids.len() == 2)
        );
        for bad in [
            "[]",
            "1",
            "[[]]",
            r#"["a",1]"#,
            "[1,-1]",
            "[1.5]",
            "[4294967296]",
            r#"[[1],"a"]"#,
            "{}",
        ] {
            assert!(prompts(bad, "prompt").is_err(), "{bad}");
        }
        assert!(is_token_ids("[1]") && is_token_ids("[ [1]]") && !is_token_ids(r#"[ "a"]"#));
        assert!(!is_token_ids(r#""a""#));
    }
}
