//! The engine's prompt of a chat with images: each placeholder the chat template wrote is
//! replaced by what the engine's processor puts there (Qwen-VL: the pad token once per image
//! token; Gemma 3: its soft tokens with their `\n\n` wrapper, which merges with the text
//! around it), so counting the expanded text counts what the engine counts
//! (`prompt_tokens` includes every image token).

use super::source::ResolvedImages;
use kvgate_tokenize::vision::VisionProcessor;
use kvgate_tokenize::{ChatPrompt, MediaKind, MediaPart, TokenRepeat};

/// The salt of each image, in render order: prefix routing hashes it in place of the
/// image's tokens ([`salt_image_ids`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSalts(pub Vec<u64>);

/// Expand every placeholder of `prompt` for `media` (the template's media parts in render
/// order, each found in `images`); the error is the client's 400 message.
///
/// With `image_token` (the id of the family's image token, a special token the tokenizer
/// never merges with its neighbours), each run of it is written once in the text and its
/// other copies are [`TokenRepeat`]s: the same ids and count, without tokenizing thousands
/// of copies of one token.
pub fn expand_images(
    prompt: &mut ChatPrompt,
    media: &[MediaPart],
    images: &ResolvedImages,
    processor: &VisionProcessor,
    image_token: Option<u32>,
) -> Result<ImageSalts, String> {
    if let Some(part) = media.iter().find(|m| m.kind != MediaKind::Image) {
        return Err(format!(
            "{} parts are not counted yet: kvgate admits text and images only",
            part.kind.part_type()
        ));
    }
    let placeholder = processor.family().placeholder();
    let found = prompt.rendered.matches(placeholder).count();
    if found != media.len() {
        // The engine's processor would refuse too (its placeholders and images disagree).
        return Err(format!(
            "the prompt holds {found} image placeholders ({placeholder}) for {} images; do not write the placeholder in text",
            media.len()
        ));
    }
    let token = processor.family().image_token();
    let mut repeats = Vec::new();
    let mut salts = Vec::with_capacity(media.len());
    let mut out = String::with_capacity(prompt.rendered.len());
    let mut rest = prompt.rendered.as_str();
    for (k, part) in media.iter().enumerate() {
        let Some(image) = images.get(&part.url) else {
            return Err(format!("image {k} was not read"));
        };
        let expansion = processor.expansion(&image.info).map_err(|e| {
            format!(
                "image {k} ({}x{}): {e}",
                image.info.width, image.info.height
            )
        })?;
        let Some(at) = rest.find(placeholder) else {
            return Err(format!("image {k} has no placeholder"));
        };
        out.push_str(&rest[..at]);
        match image_token {
            Some(id) => once_per_run(&expansion.replacement, token, id, &mut out, &mut repeats),
            None => out.push_str(&expansion.replacement),
        }
        rest = &rest[at + placeholder.len()..];
        salts.push(image.salt);
    }
    out.push_str(rest);
    if image_token.is_some() && out.matches(token).count() != repeats.len() {
        // A copy of the image token typed in the text: the engine would expand it too.
        return Err(format!(
            "the prompt holds the image token {token} outside its images; do not write it in text"
        ));
    }
    prompt.rendered = out;
    prompt.repeats.extend(repeats);
    Ok(ImageSalts(salts))
}

/// `replacement` into `out` with each run of `token` written once, its other copies in
/// `repeats`.
fn once_per_run(
    replacement: &str,
    token: &str,
    id: u32,
    out: &mut String,
    repeats: &mut Vec<TokenRepeat>,
) {
    let mut rest = replacement;
    while let Some(at) = rest.find(token) {
        out.push_str(&rest[..at]);
        out.push_str(token);
        let mut run = &rest[at + token.len()..];
        let mut extra = 0u32;
        while let Some(next) = run.strip_prefix(token) {
            run = next;
            extra += 1;
        }
        repeats.push(TokenRepeat { token: id, extra });
        rest = run;
    }
    out.push_str(rest);
}

/// Replace each run of `image_token` ids (one run per image, in order) by ids made of its
/// image's salt, outside any vocabulary (the high bit set): the prompt's KV blocks then
/// differ wherever its images differ, as SGLang's radix cache keys image tokens by the
/// image's hash (`mm_utils` pads them with a value derived from it).
pub fn salt_image_ids(ids: &mut [u32], image_token: u32, salts: &ImageSalts) {
    let mut image = 0usize;
    let mut in_run = false;
    for id in ids.iter_mut() {
        if *id != image_token {
            if in_run {
                image += 1;
                in_run = false;
            }
            continue;
        }
        in_run = true;
        if let Some(salt) = salts.0.get(image) {
            *id = 0x8000_0000 | ((*salt as u32) ^ ((*salt >> 32) as u32));
        }
    }
}
