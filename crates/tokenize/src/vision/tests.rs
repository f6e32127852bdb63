//! Unit tests of the resize arithmetic and the processors' counts and expansions.

use super::resize::sglang_legacy_resize;
use super::*;

fn info(width: u32, height: u32) -> ImageInfo {
    ImageInfo {
        format: ImageFormat::Png,
        width,
        height,
    }
}

const QWEN25: &str = r#"{"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
    "temporal_patch_size": 2, "merge_size": 2}"#;
const QWEN3: &str = r#"{"size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2}"#;
const GEMMA3: &str = r#"{"image_seq_length": 256, "do_pan_and_scan": null,
    "size": {"height": 896, "width": 896}}"#;

#[test]
fn round_half_even_matches_python() {
    // Python: round(0.5) = 0, round(1.5) = 2, round(2.5) = 2, round(3.5) = 4.
    assert_eq!(round_half_even_div(14, 28), 0);
    assert_eq!(round_half_even_div(42, 28), 2);
    assert_eq!(round_half_even_div(70, 28), 2);
    assert_eq!(round_half_even_div(98, 28), 4);
    assert_eq!(round_half_even_div(400, 32), 12); // 12.5 -> 12
    assert_eq!(round_half_even_div(15, 28), 1);
    assert_eq!(round_half_even_div(13, 28), 0);
    // Against f64::round_ties_even of the float quotient, as Python computes it.
    for factor in [28u64, 32] {
        for n in 0..20_000u64 {
            let float = (n as f64 / factor as f64).round_ties_even() as u64;
            assert_eq!(round_half_even_div(n, factor), float, "{n}/{factor}");
        }
    }
}

#[test]
fn smart_resize_half_cases_round_to_even() {
    // 14 px rounds to 0 (then scales up), 42 to 28, 70 to 56: not to 28 / 56 / 84.
    assert_eq!(
        smart_resize(70, 70, 28, 3136, 12845056).map(|r| r.height),
        Ok(56)
    );
    assert_eq!(
        smart_resize(98, 42, 28, 3136, 12845056).map(|r| (r.height, r.width)),
        Ok((112, 56))
    );
}

#[test]
fn aspect_ratio_limit_and_message() {
    assert_eq!(
        smart_resize(1, 200, 28, 3136, 12845056).map(|r| r.width),
        Ok(812)
    );
    let error = smart_resize(1, 201, 28, 3136, 12845056).expect_err("201:1");
    assert_eq!(
        error.to_string(),
        "absolute aspect ratio must be smaller than 200, got 201.0"
    );
    let error = smart_resize(2, 401, 28, 3136, 12845056).expect_err("200.5:1");
    assert_eq!(
        error.to_string(),
        "absolute aspect ratio must be smaller than 200, got 200.5"
    );
    assert!(matches!(
        sglang_legacy_resize(1, 201, 28, 3136, 1),
        Err(VisionError::AspectRatio { .. })
    ));
}

#[test]
fn qwen25_counts_quoted_in_issue_41() {
    let current = VisionProcessor::new(VisionFamily::Qwen2Vl, QWEN25).expect("config");
    let legacy = current
        .clone()
        .with_pre_resize_cap(Some(SGLANG_LEGACY_DEFAULT_CAP));
    let capped = current.clone().with_pre_resize_cap(Some(1_003_520));
    assert_eq!(current.image_tokens(&info(1920, 1080)), Ok(2691));
    assert_eq!(legacy.image_tokens(&info(1920, 1080)), Ok(2691));
    assert_eq!(capped.image_tokens(&info(1920, 1080)), Ok(1222));
    assert_eq!(current.image_tokens(&info(10, 2000)), Ok(29));
    assert_eq!(legacy.image_tokens(&info(10, 2000)), Ok(71));
}

#[test]
fn qwen3_reads_size_areas() {
    let p = VisionProcessor::new(VisionFamily::Qwen3Vl, QWEN3).expect("config");
    // 1x1 scales up to 256x256 (65,536 px): a 16x16 grid, 64 tokens.
    assert_eq!(p.image_tokens(&info(1, 1)), Ok(64));
    assert_eq!(p.image_tokens(&info(1920, 1080)), Ok(2040));
}

#[test]
fn qwen_config_rules() {
    // No size and no bounds: the class defaults (56*56, 28*28*1280).
    let p = VisionProcessor::new(VisionFamily::Qwen2Vl, "{}").expect("defaults");
    assert_eq!(p.image_tokens(&info(4000, 4000)), Ok(1225));
    // A size without both keys is refused, as HF's resize does.
    let half = r#"{"size": {"longest_edge": 1000000}}"#;
    assert!(matches!(
        VisionProcessor::new(VisionFamily::Qwen2Vl, half),
        Err(VisionError::Setting { field: "size", .. })
    ));
    // Top-level bounds win over size.
    let both = r#"{"size": {"longest_edge": 1, "shortest_edge": 1}, "min_pixels": 3136,
        "max_pixels": 12845056}"#;
    let p = VisionProcessor::new(VisionFamily::Qwen2Vl, both).expect("config");
    assert_eq!(p.image_tokens(&info(1920, 1080)), Ok(2691));
    assert!(matches!(
        VisionProcessor::new(VisionFamily::Qwen2Vl, r#"{"patch_size": 0}"#),
        Err(VisionError::Setting {
            field: "patch_size",
            ..
        })
    ));
    assert!(matches!(
        VisionProcessor::new(VisionFamily::Qwen2Vl, r#"{"patch_size": "x"}"#),
        Err(VisionError::Config(_))
    ));
    // Absurd sizes are refused, not left to overflow.
    let huge = r#"{"merge_size": 18446744073709551615}"#;
    assert!(matches!(
        VisionProcessor::new(VisionFamily::Qwen2Vl, huge),
        Err(VisionError::Setting {
            field: "merge_size",
            ..
        })
    ));
}

#[test]
fn legacy_pre_resize_to_a_tiny_cap_is_an_error_not_a_zero_grid() {
    let p = VisionProcessor::new(VisionFamily::Qwen2Vl, QWEN25)
        .expect("config")
        .with_pre_resize_cap(Some(1000));
    assert_eq!(
        p.image_tokens(&info(100, 10)),
        Err(VisionError::PreResizeToZero { max_pixels: 1000 })
    );
}

#[test]
fn gemma3_is_256_whatever_the_size() {
    let p = VisionProcessor::new(VisionFamily::Gemma3, GEMMA3).expect("config");
    for (w, h) in [(1, 1), (1, 201), (1920, 1080), (13_000, 13_000)] {
        assert_eq!(p.image_tokens(&info(w, h)), Ok(256));
    }
    let e = p.expansion(&info(5, 5)).expect("expansion");
    assert_eq!(e.placeholder, "<start_of_image>");
    assert!(e
        .replacement
        .starts_with("\n\n<start_of_image><image_soft_token>"));
    assert!(e
        .replacement
        .ends_with("<image_soft_token><end_of_image>\n\n"));
    assert_eq!(e.replacement.matches("<image_soft_token>").count(), 256);
}

#[test]
fn gemma3_pan_and_scan_crops() {
    let config = r#"{"image_seq_length": 256, "do_pan_and_scan": true}"#;
    let p = VisionProcessor::new(VisionFamily::Gemma3, config).expect("config");
    // Under the 1.2 ratio: no crops. 1920x1080: round(1.78) = 2 crops. 5000x1000: 5 -> max 4.
    assert_eq!(p.image_tokens(&info(1000, 900)), Ok(256));
    assert_eq!(p.image_tokens(&info(1920, 1080)), Ok(768));
    assert_eq!(p.image_tokens(&info(5000, 1000)), Ok(1280));
    // Crops under 256 px on the short side: none.
    assert_eq!(p.image_tokens(&info(600, 200)), Ok(256));
    let e = p.expansion(&info(1920, 1080)).expect("expansion");
    assert!(e
        .replacement
        .starts_with("Here is the original image \n\n<start_of_image>"));
    assert_eq!(e.replacement.matches("<start_of_image>").count(), 3);
    assert_eq!(e.image_tokens, 768);
}

#[test]
fn qwen_expansion_wraps_the_pads() {
    let p = VisionProcessor::new(VisionFamily::Qwen2Vl, QWEN25).expect("config");
    let e = p.expansion(&info(28, 28)).expect("expansion");
    assert_eq!(e.placeholder, "<|vision_start|><|image_pad|><|vision_end|>");
    assert_eq!(
        e.replacement,
        "<|vision_start|><|image_pad|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>"
    );
    assert_eq!(e.image_tokens, 4);
}
