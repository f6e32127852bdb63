//! The processors' sizes, worked by hand from the rules in `vision.rs`. They were checked
//! once against the real code, run in Python: transformers 5.19's `Qwen2VLImageProcessorPil`
//! (Qwen2.5-VL's and Qwen3-VL's settings) gave the same `image_grid_thw` for 1920x1080,
//! 10x2000, 28x28 and 640x480 and the same error for 2001x10, and sglang's own
//! `smart_resize` (the older releases' pre-resize) the same sizes under a cap.

use super::*;
use crate::vision_prompt::expand;

fn qwen25(width: u64, height: u64) -> Result<usize, VisionError> {
    image_tokens(&VisionConfig::new(VisionFamily::Qwen25Vl), width, height)
}

fn capped(family: VisionFamily, cap: u64, width: u64, height: u64) -> usize {
    let config = VisionConfig {
        family,
        max_pixels_cap: Some(cap),
    };
    image_tokens(&config, width, height).unwrap()
}

#[test]
fn qwen2_5_vl_sizes_as_its_processor_does() {
    // 1920x1080: 1080/28 = 38.57 -> 39 rows, 1920/28 = 68.57 -> 69 columns (1092x1932 =
    // 2,109,744 pixels, inside [3136, 12845056]): 39 * 69 merged patches.
    assert_eq!(qwen25(1920, 1080), Ok(2691));
    // 10 wide, 2000 high: the width rounds to 0, so the min_pixels branch scales up by
    // sqrt(3136 / 20000) = 0.396: ceil(0.141) = 1 column, ceil(28.28) = 29 rows.
    assert_eq!(qwen25(10, 2000), Ok(29));
    assert_eq!(qwen25(2000, 10), Ok(29));
    // 28x28 is one factor square (784 px < 3136): scaled by 2 to 56x56, 2x2.
    assert_eq!(qwen25(28, 28), Ok(4));
    assert_eq!(qwen25(1, 1), Ok(4));
    // 640x480: 17 x 23 (476x644).
    assert_eq!(qwen25(640, 480), Ok(391));
    // 8000x8000 is over max_pixels: sqrt(64e6 / 12845056) = 2.232 -> floor(128.0) = 128.
    assert_eq!(qwen25(8000, 8000), Ok(16384));
}

#[test]
fn qwen3_vl_uses_factor_32_and_its_own_bounds() {
    let qwen3 = |w, h| image_tokens(&VisionConfig::new(VisionFamily::Qwen3Vl), w, h);
    // 1080/32 = 33.75 -> 34, 1920/32 = 60: 34 * 60.
    assert_eq!(qwen3(1920, 1080), Ok(2040));
    // 28x28 is under 65536 pixels: scaled to 256x256, 8x8.
    assert_eq!(qwen3(28, 28), Ok(64));
    assert_eq!(qwen3(640, 480), Ok(300));
    assert_eq!(qwen3(10, 2000), Ok(114));
}

#[test]
fn an_older_sglang_resizes_first_to_its_pixel_cap() {
    // Cap 1280*28*28 = 1003520: 1920x1080 is first brought to 728x1316 (26 * 47).
    assert_eq!(capped(VisionFamily::Qwen25Vl, 1_003_520, 1920, 1080), 1222);
    // SGLang's own step keeps a side at least one factor: 10x2000 -> 28x1988, 71 columns.
    assert_eq!(capped(VisionFamily::Qwen25Vl, 12_845_056, 10, 2000), 71);
    // Under the default cap a normal image is unchanged.
    assert_eq!(capped(VisionFamily::Qwen25Vl, 12_845_056, 1920, 1080), 2691);
    // Qwen3-VL after the factor-28 step: 1920x1088 from 1932x1092.
    assert_eq!(capped(VisionFamily::Qwen3Vl, 12_845_056, 1920, 1080), 2040);
    assert_eq!(capped(VisionFamily::Qwen3Vl, 1_003_520, 4000, 3000), 936);
}

#[test]
fn a_ratio_over_200_is_the_processors_error() {
    assert_eq!(qwen25(10, 2000).map(|_| ()), Ok(()));
    let err = qwen25(10, 2001).unwrap_err();
    assert_eq!(
        err.to_string(),
        "absolute aspect ratio must be smaller than 200, got 200.1"
    );
    let err = qwen25(1, 201).unwrap_err();
    assert_eq!(
        err.to_string(),
        "absolute aspect ratio must be smaller than 200, got 201.0"
    );
    // Gemma 3 resizes to a square whatever the ratio.
    let gemma = VisionConfig::new(VisionFamily::Gemma3);
    assert_eq!(image_tokens(&gemma, 1, 1000), Ok(256));
}

#[test]
fn python_floats_print_as_python_prints_them() {
    assert_eq!(python_float(201.0), "201.0");
    assert_eq!(python_float(200.1), "200.1");
    assert_eq!(python_float(2000.0 / 7.0), "285.7142857142857");
}

#[test]
fn placeholders_expand_in_order_and_must_match_the_images() {
    let qwen = expand(
        VisionFamily::Qwen25Vl,
        "a<|image_pad|>b<|image_pad|>c",
        &[2, 1],
    );
    assert_eq!(
        qwen.as_deref(),
        Ok("a<|image_pad|><|image_pad|>b<|image_pad|>c")
    );
    let gemma = expand(VisionFamily::Gemma3, "x<start_of_image>y", &[256]).unwrap();
    assert!(gemma.starts_with("x\n\n<start_of_image><image_soft_token>"));
    assert!(gemma.ends_with("<image_soft_token><end_of_image>\n\ny"));
    assert_eq!(gemma.matches("<image_soft_token>").count(), 256);
    assert_eq!(
        expand(VisionFamily::Gemma3, "no image", &[256]).unwrap_err(),
        "Prompt contained 0 image tokens but received 1 images."
    );
    assert!(expand(VisionFamily::Qwen3Vl, "<|image_pad|>", &[]).is_err());
}
