use super::source::image_urls;
use super::*;
use kvgate_tokenize::vision::{ImageFormat, ImageInfo, VisionFamily, VisionProcessor};
use kvgate_tokenize::{ChatPrompt, MediaKind, MediaPart};
use serde_json::json;

fn processor(family: VisionFamily, dir: &str) -> VisionProcessor {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/vision")
        .join(dir)
        .join("preprocessor_config.json");
    VisionProcessor::from_file(family, &path).expect("the vendored preprocessor config")
}

fn image(url: &str, width: u32, height: u32, salt: u64) -> (String, ResolvedImage) {
    let info = ImageInfo {
        format: ImageFormat::Png,
        width,
        height,
    };
    (
        url.to_owned(),
        ResolvedImage {
            info,
            salt,
            remote: false,
        },
    )
}

fn part(url: &str) -> MediaPart {
    MediaPart {
        kind: MediaKind::Image,
        url: url.to_owned(),
        detail: None,
    }
}

fn prompt(rendered: &str) -> ChatPrompt {
    ChatPrompt {
        rendered: rendered.to_owned(),
        add_special_tokens: false,
        appended: None,
        repeats: Vec::new(),
    }
}

#[test]
fn each_qwen_placeholder_becomes_its_images_pads_in_order() {
    let qwen = processor(VisionFamily::Qwen2Vl, "Qwen2.5-VL-7B-Instruct");
    let images: ResolvedImages = [image("a", 28, 28, 1), image("b", 56, 28, 2)]
        .into_iter()
        .collect();
    let ph = "<|vision_start|><|image_pad|><|vision_end|>";
    let mut p = prompt(&format!("x{ph}y{ph}z"));
    let salts = expand_images(&mut p, &[part("b"), part("a")], &images, &qwen, None).unwrap();
    assert_eq!(salts, ImageSalts(vec![2, 1]));
    // Both are scaled up to min_pixels (56x56, 4 tokens); 56x28 to 84x42, 6 tokens.
    let pads = |n: usize| "<|image_pad|>".repeat(n);
    assert_eq!(
        p.rendered,
        format!(
            "x<|vision_start|>{}<|vision_end|>y<|vision_start|>{}<|vision_end|>z",
            pads(6),
            pads(4)
        )
    );
}

#[test]
fn gemma_images_bring_their_newlines_into_the_text() {
    let gemma = processor(VisionFamily::Gemma3, "gemma-3-4b-it");
    let images: ResolvedImages = [image("a", 640, 480, 7)].into_iter().collect();
    let mut p = prompt("<start_of_turn>user\nLook: <start_of_image> what?");
    expand_images(&mut p, &[part("a")], &images, &gemma, None).unwrap();
    assert!(p
        .rendered
        .starts_with("<start_of_turn>user\nLook: \n\n<start_of_image><image_soft_token>"));
    assert_eq!(p.rendered.matches("<image_soft_token>").count(), 256);
    assert!(p.rendered.ends_with("<end_of_image>\n\n what?"));
}

#[test]
fn placeholders_and_images_that_disagree_are_refused() {
    let qwen = processor(VisionFamily::Qwen2Vl, "Qwen2.5-VL-7B-Instruct");
    let images: ResolvedImages = [image("a", 28, 28, 1)].into_iter().collect();
    let ph = "<|vision_start|><|image_pad|><|vision_end|>";
    // A placeholder typed in the text as well as the image's own.
    let mut p = prompt(&format!("{ph} and {ph}"));
    let e = expand_images(&mut p, &[part("a")], &images, &qwen, None).unwrap_err();
    assert!(e.contains("2 image placeholders"), "{e}");
    // Video is not counted yet.
    let video = MediaPart {
        kind: MediaKind::Video,
        ..part("a")
    };
    let e = expand_images(&mut prompt(ph), &[video], &images, &qwen, None).unwrap_err();
    assert!(e.contains("video_url parts are not counted yet"), "{e}");
    // The processor's own refusal: an aspect ratio over 200.
    let thin: ResolvedImages = [image("t", 2010, 10, 1)].into_iter().collect();
    let e = expand_images(&mut prompt(ph), &[part("t")], &thin, &qwen, None).unwrap_err();
    assert!(e.contains("aspect ratio"), "{e}");
}

#[test]
fn each_images_run_of_tokens_is_salted_with_its_own_hash() {
    let pad = 151_655;
    let mut ids = vec![1, pad, pad, 2, pad, 3];
    salt_image_ids(&mut ids, pad, &ImageSalts(vec![10, 20]));
    assert_eq!(ids[0], 1);
    assert_eq!(ids[1], ids[2]);
    assert_ne!(ids[1], pad);
    assert_ne!(ids[1], ids[4], "two images, two salts");
    assert!(ids[1] & 0x8000_0000 != 0, "outside the vocabulary");
    assert_eq!((ids[3], ids[5]), (2, 3));
}

#[test]
fn image_urls_are_found_in_message_order_with_their_field() {
    let messages = json!([
        {"role": "system", "content": "s"},
        {"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}
        ]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
    ]);
    let urls = image_urls(&messages);
    assert_eq!(
        urls,
        vec![
            (
                "messages[1].content[1].image_url.url".to_owned(),
                "data:image/png;base64,AA"
            ),
            (
                "messages[2].content[0].image_url.url".to_owned(),
                "https://x/y.png"
            )
        ]
    );
}

#[test]
fn a_run_of_image_tokens_is_written_once_and_counted_and_expanded_the_same() {
    let tok = kvgate_tokenize::ModelTokenizer::from_dir(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen2_5_vl"),
    )
    .expect("the Qwen2.5-VL stand-in");
    let pad = tok.encode("<|image_pad|>", false).expect("encodes")[0];
    let qwen = processor(VisionFamily::Qwen2Vl, "Qwen2.5-VL-7B-Instruct");
    let images: ResolvedImages = [image("a", 1920, 1080, 1), image("b", 640, 480, 2)]
        .into_iter()
        .collect();
    let ph = "<|vision_start|><|image_pad|><|vision_end|>";
    let text = format!("<|im_start|>user\n{ph}Compare with{ph}\nplease<|im_end|>\n");
    let media = [part("a"), part("b")];
    let mut full = prompt(&text);
    expand_images(&mut full, &media, &images, &qwen, None).unwrap();
    let mut once = prompt(&text);
    expand_images(&mut once, &media, &images, &qwen, Some(pad)).unwrap();
    assert_eq!(once.rendered.matches("<|image_pad|>").count(), 2);
    assert_eq!(
        once.repeats,
        vec![
            kvgate_tokenize::TokenRepeat {
                token: pad,
                extra: 2690
            },
            kvgate_tokenize::TokenRepeat {
                token: pad,
                extra: 390
            },
        ]
    );
    assert_eq!(
        tok.chat_prompt_ids(&once).unwrap(),
        tok.chat_prompt_ids(&full).unwrap()
    );
    assert_eq!(
        tok.count_chat_prompt(&once).unwrap(),
        tok.count_chat_prompt(&full).unwrap()
    );
    // The image token typed in the text is refused (the engine would expand it too).
    let mut typed = prompt(&format!("{text}<|image_pad|>"));
    let e = expand_images(&mut typed, &media, &images, &qwen, Some(pad)).unwrap_err();
    assert!(e.contains("outside its images"), "{e}");
}
