//! Media parts through SGLang's preparation, on the Qwen2.5-VL stand-in (an "openai"
//! template with image placeholders) and on Qwen3's text template.

use serde_json::{json, Value};

use super::*;
use crate::prepare::{ChatRequest, ChatRules};
use crate::ModelTokenizer;

fn tokenizer(name: &str) -> ModelTokenizer {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config/tokenizers")
        .join(name);
    ModelTokenizer::from_dir(&dir).unwrap()
}

fn prepare(
    tok: &ModelTokenizer,
    body: Value,
    input: ModelInput,
) -> Result<MultimodalPrompt, TokenizeError> {
    let request = ChatRequest::from_body(body.as_object().unwrap()).unwrap();
    tok.chat_prompt_with_media(ChatRules::Sglang, &request, input)
}

fn image(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

#[test]
fn a_multimodal_model_gets_placeholders_and_the_images_in_order() {
    let tok = tokenizer("qwen2_5_vl");
    let body = json!({"messages": [
        {"role": "user", "content": [image("data:a"), {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "http://h/b.png", "detail": "low"}}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image("data:c")]}]});
    let out = prepare(&tok, body, ModelInput::Multimodal).unwrap();
    assert_eq!(
        out.prompt.rendered,
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n\
         <|vision_start|><|image_pad|><|vision_end|>Compare<|vision_start|><|image_pad|><|vision_end|><|im_end|>\n\
         <|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\n\
         <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n<|im_start|>assistant\n"
    );
    let urls: Vec<&str> = out.media.iter().map(|m| m.url.as_str()).collect();
    assert_eq!(urls, ["data:a", "http://h/b.png", "data:c"]);
    assert!(out.media.iter().all(|m| m.kind == MediaKind::Image));
    assert_eq!(out.media[1].detail.as_deref(), Some("low"));
}

#[test]
fn a_text_only_model_refuses_media_as_before() {
    let tok = tokenizer("qwen2_5_vl");
    for (part, kind) in [
        (image("data:a"), "image_url"),
        (
            json!({"type": "video_url", "video_url": {"url": "v"}}),
            "video_url",
        ),
        (
            json!({"type": "audio_url", "audio_url": {"url": "a"}}),
            "audio_url",
        ),
        (
            json!({"type": "input_audio", "input_audio": {}}),
            "input_audio",
        ),
    ] {
        let body = json!({"messages": [{"role": "user", "content": [part]}]});
        let err = prepare(&tok, body.clone(), ModelInput::TextOnly).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("Model only supports text input; received unsupported content type '{kind}'.")
        );
        // `chat_prompt` is the text-only preparation.
        let request = ChatRequest::from_body(body.as_object().unwrap()).unwrap();
        assert!(tok.chat_prompt(ChatRules::Sglang, &request).is_err());
    }
}

#[test]
fn text_only_chats_render_the_same_either_way() {
    let tok = tokenizer("qwen3");
    let body = json!({"messages": [
        {"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        {"role": "user", "content": "hi"}]});
    let text = prepare(&tok, body.clone(), ModelInput::TextOnly).unwrap();
    let multi = prepare(&tok, body, ModelInput::Multimodal).unwrap();
    assert_eq!(text, multi);
    assert!(multi.media.is_empty());
}

#[test]
fn videos_are_listed_and_malformed_parts_refused() {
    let tok = tokenizer("qwen2_5_vl");
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": "v.mp4"}}]}]});
    let out = prepare(&tok, body, ModelInput::Multimodal).unwrap();
    assert!(out
        .prompt
        .rendered
        .contains("<|vision_start|><|video_pad|><|vision_end|>"));
    assert_eq!(out.media[0].kind, MediaKind::Video);
    for bad in [
        json!({"type": "image_url"}),
        json!({"type": "image_url", "image_url": {"url": 3}}),
        json!({"type": "image_url", "image_url": {"url": "x", "detail": "max"}}),
    ] {
        let body = json!({"messages": [{"role": "user", "content": [bad]}]});
        let err = prepare(&tok, body, ModelInput::Multimodal).unwrap_err();
        assert!(
            err.to_string().starts_with("messages[0].content[0]: "),
            "{err}"
        );
    }
}
