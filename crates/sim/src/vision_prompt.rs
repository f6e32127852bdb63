//! A chat with images on a vision model: the prompt SGLang tokenizes and counts.
//!
//! The chat is prepared by SGLang's rules for a multimodal model
//! (`kvgate_tokenize::ModelTokenizer::chat_prompt_with_media`: each `image_url` part is a
//! `{"type": "image"}` for the template, which renders the model's placeholder), each image
//! is loaded and sized (`vision_load`, `vision`), and each placeholder is expanded to the
//! image's tokens before the prompt is tokenized, as the HF processor does:
//!
//! - Qwen-VL: the template's `<|vision_start|><|image_pad|><|vision_end|>` keeps its start
//!   and end tokens and its `<|image_pad|>` becomes one per image token
//!   (`Qwen2VLProcessor.__call__`; sglang 0.5.23 `qwen_vl.py` `build_input_ids` does the
//!   same on ids);
//! - Gemma 3: `<start_of_image>` becomes `\n\n<start_of_image>` + 256 ×
//!   `<image_soft_token>` + `<end_of_image>\n\n` (`Gemma3Processor.full_image_sequence`), and
//!   the whole text is tokenized again (its newlines join the text around them).
//!
//! The render starts with the template's own BOS where the model has one (Gemma 3), and is
//! encoded without special tokens, as for any chat: SGLang's `process_mm_data` ("Avoid
//! double BOS when the chat template already wrote one") passes `add_special_tokens=False`
//! for such a text. `usage.prompt_tokens` is the length of the result.
//!
//! Video and audio parts: SGLang hands them to the model's processor (Qwen-VL decodes a
//! video's frames); the sim does not model their tokens and refuses them with a 400 in
//! SGLang's error shape whose message says so.

use kvgate_tokenize::{ChatRequest, ChatRules, MediaKind, ModelInput, ModelTokenizer};

use super::vision::{image_tokens, VisionConfig, VisionFamily, GEMMA3_IMAGE_TOKENS};
use super::vision_load::{image_bytes, image_size, Fetched};

/// Qwen-VL's image placeholder token (`Qwen2VLProcessor.image_token`).
const QWEN_IMAGE_PAD: &str = "<|image_pad|>";
/// Gemma 3's `boi_token`, the template's image placeholder.
const GEMMA_BOI: &str = "<start_of_image>";

/// The prompt of `request` on a vision model: the render with every image placeholder
/// expanded, and whether it is encoded with special tokens; `Err` holds SGLang's message.
pub(crate) fn expanded_prompt(
    vision: &VisionConfig,
    rules: ChatRules,
    tokenizer: &ModelTokenizer,
    request: &ChatRequest<'_>,
    fetched: &Fetched,
) -> Result<kvgate_tokenize::ChatPrompt, String> {
    let prepared = tokenizer
        .chat_prompt_with_media(rules, request, ModelInput::Multimodal)
        .map_err(|e| e.to_string())?;
    let mut counts = Vec::with_capacity(prepared.media.len());
    for part in &prepared.media {
        if part.kind != MediaKind::Image {
            return Err(format!(
                "Model only supports text and image input in the simulated engine; received unsupported content type '{}'.",
                part.kind.part_type()
            ));
        }
        let bytes = image_bytes(&part.url, fetched).map_err(|e| e.to_string())?;
        let (width, height) = image_size(&bytes).map_err(|e| e.to_string())?;
        counts.push(image_tokens(vision, width, height).map_err(|e| e.to_string())?);
    }
    let mut prompt = prepared.prompt;
    prompt.rendered = expand(vision.family, &prompt.rendered, &counts)?;
    Ok(prompt)
}

/// `rendered` with its k-th image placeholder expanded to `counts[k]` image tokens.
pub(crate) fn expand(
    family: VisionFamily,
    rendered: &str,
    counts: &[usize],
) -> Result<String, String> {
    let placeholder = match family {
        VisionFamily::Qwen25Vl | VisionFamily::Qwen3Vl => QWEN_IMAGE_PAD,
        VisionFamily::Gemma3 => GEMMA_BOI,
    };
    let found = rendered.matches(placeholder).count();
    if found != counts.len() {
        return Err(match family {
            // transformers' `Gemma3Processor.__call__`.
            VisionFamily::Gemma3 => format!(
                "Prompt contained {found} image tokens but received {} images.",
                counts.len()
            ),
            // sglang 0.5.23 `qwen_vl.py`, when images and placeholders disagree.
            _ => "Qwen-VL image artifacts do not match prompt placeholders".to_owned(),
        });
    }
    let extra: usize = counts.iter().sum::<usize>() * placeholder.len();
    let mut out = String::with_capacity(rendered.len() + extra);
    let mut rest = rendered;
    for &count in counts {
        let Some(at) = rest.find(placeholder) else {
            break;
        };
        out.push_str(&rest[..at]);
        match family {
            VisionFamily::Qwen25Vl | VisionFamily::Qwen3Vl => {
                out.push_str(&QWEN_IMAGE_PAD.repeat(count));
            }
            VisionFamily::Gemma3 => {
                out.push_str("\n\n<start_of_image>");
                out.push_str(&"<image_soft_token>".repeat(GEMMA3_IMAGE_TOKENS));
                out.push_str("<end_of_image>\n\n");
            }
        }
        rest = &rest[at + placeholder.len()..];
    }
    out.push_str(rest);
    Ok(out)
}
