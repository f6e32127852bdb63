//! A vision model's image processor, as the tokens it gives each image: the simulated
//! engine's own implementation, kept apart from kvgate's counter on purpose (the sim is
//! the oracle the gateway's count is tested against, so a bug in one shows in the other).
//!
//! What SGLang does with an image part of a chat (sglang 0.5.23, transformers 5.19.0 as it
//! pins): the template renders the model's placeholder (`vision_prompt.rs`), the image is
//! loaded (`vision_load.rs`), and the HF processor sizes it and expands the placeholder:
//!
//! - **Qwen2-VL / Qwen2.5-VL / Qwen3-VL** (`transformers/models/qwen2_vl/
//!   image_processing_qwen2_vl.py` `smart_resize`, used by `Qwen2VLImageProcessor` for all
//!   three): the image is resized to multiples of `factor = patch_size * merge_size`,
//!   rounding each side half-to-even (Python's `round`), then scaled down (floor, at least
//!   one factor) when over `max_pixels` or up (ceil) when under `min_pixels`; an aspect
//!   ratio over 200 is a `ValueError`. The image then takes `(h / patch) * (w / patch) /
//!   merge²` tokens: its `<|image_pad|>` becomes that many. transformers 5.19 has no
//!   "side smaller than factor" error any more (older releases raised one); a side that
//!   rounds to 0 is scaled up by the `min_pixels` branch instead.
//! - **Older SGLang releases** (e.g. `python/sglang/srt/multimodal/processors/qwen_vl.py`
//!   at sgl-project/sglang commit 02065f00) first resized every Qwen-VL image themselves
//!   (`resize_image`: their own `smart_resize` with factor 28, `min_pixels = 4 * 28 * 28`,
//!   `max_pixels = SGLANG_IMAGE_MAX_PIXELS`, default `16384 * 28 * 28`, sides at least one
//!   factor) and handed the resized image to the processor. 0.5.23 no longer does; the
//!   sim models those releases with `--vision-max-pixels-cap N` (that `max_pixels`).
//! - **Gemma 3** (`transformers/models/gemma3/processing_gemma3.py`): every image is resized
//!   to the vision tower's square input and takes `image_seq_length = 256` tokens, the
//!   text's `<start_of_image>` replaced by `\n\n<start_of_image>` + 256 × `<image_soft_token>`
//!   + `<end_of_image>\n\n` before tokenization (pan-and-scan is off by default).

use std::fmt::Write as _;

/// The vision model families the sim can play (`--vision`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisionFamily {
    /// Qwen2.5-VL (and Qwen2-VL: the same processor settings).
    #[value(name = "qwen2_5_vl")]
    Qwen25Vl,
    /// Qwen3-VL.
    #[value(name = "qwen3_vl")]
    Qwen3Vl,
    /// Gemma 3 (4B and larger: the vision models).
    #[value(name = "gemma3")]
    Gemma3,
}

/// A vision model configuration of the sim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VisionConfig {
    /// Which processor sizes the images.
    pub family: VisionFamily,
    /// An older SGLang's own resize before the processor (Qwen-VL families): its
    /// `max_pixels` (`SGLANG_IMAGE_MAX_PIXELS`). `None`: no such step, as in 0.5.23.
    pub max_pixels_cap: Option<u64>,
}

impl VisionConfig {
    /// A configuration of `family` with no pre-resize.
    pub fn new(family: VisionFamily) -> Self {
        Self {
            family,
            max_pixels_cap: None,
        }
    }
}

/// A Qwen-VL image processor's settings (`preprocessor_config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QwenProcessor {
    pub(crate) patch_size: u64,
    pub(crate) merge_size: u64,
    pub(crate) min_pixels: u64,
    pub(crate) max_pixels: u64,
}

/// Qwen2.5-VL-{3,7,32,72}B-Instruct's `preprocessor_config.json`: `min_pixels` 3136,
/// `max_pixels` 12845056, `patch_size` 14, `merge_size` 2 (read from copies of that file
/// quoted in public code, e.g. a `Qwen2_5_VLImageProcessor` fixture; not from the HF hub,
/// which these machines cannot reach: unverified there). Qwen2-VL-*-Instruct ships the
/// same values.
pub(crate) const QWEN2_5_VL: QwenProcessor = QwenProcessor {
    patch_size: 14,
    merge_size: 2,
    min_pixels: 3136,
    max_pixels: 12_845_056,
};

/// Qwen3-VL's `preprocessor_config.json`: `size.shortest_edge` 65536 (`min_pixels`),
/// `size.longest_edge` 16777216 (`max_pixels`), `patch_size` 16, `merge_size` 2 (read from
/// copies of the Qwen3-VL / Qwen3.5 processor config in public code; unverified on the hub).
pub(crate) const QWEN3_VL: QwenProcessor = QwenProcessor {
    patch_size: 16,
    merge_size: 2,
    min_pixels: 65_536,
    max_pixels: 16_777_216,
};

/// Gemma 3's `image_seq_length` (`Gemma3Processor`'s default and gemma-3-*-it's
/// `processor_config.json`, `mm_tokens_per_image` 256).
pub(crate) const GEMMA3_IMAGE_TOKENS: usize = 256;

/// Older SGLang's own pre-resize: factor 28, `min_pixels = 4 * 28 * 28` (`qwen_vl.py`
/// `IMAGE_FACTOR`, `MIN_PIXELS`).
const PRE_RESIZE_FACTOR: u64 = 28;
const PRE_RESIZE_MIN_PIXELS: u64 = 4 * 28 * 28;
/// `MAX_RATIO` of both `smart_resize`s.
const MAX_RATIO: f64 = 200.0;

/// Why an image cannot be processed: the processor's `ValueError`, whose text SGLang
/// returns in a 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum VisionError {
    #[error("absolute aspect ratio must be smaller than 200, got {0}")]
    AspectRatio(String),
    #[error("{0}")]
    Image(String),
}

/// The tokens an image of `width` × `height` pixels takes on `config`'s model.
pub(crate) fn image_tokens(
    config: &VisionConfig,
    width: u64,
    height: u64,
) -> Result<usize, VisionError> {
    let processor = match config.family {
        VisionFamily::Gemma3 => return Ok(GEMMA3_IMAGE_TOKENS),
        VisionFamily::Qwen25Vl => QWEN2_5_VL,
        VisionFamily::Qwen3Vl => QWEN3_VL,
    };
    if width == 0 || height == 0 {
        return Err(VisionError::Image(format!(
            "image has no pixels ({width}x{height})"
        )));
    }
    let (mut h, mut w) = (height, width);
    if let Some(cap) = config.max_pixels_cap {
        (h, w) = pre_resize(h, w, cap)?;
    }
    let (h, w) = qwen_tokens_grid(&processor, h, w)?;
    let tokens = h.saturating_mul(w);
    Ok(usize::try_from(tokens).unwrap_or(usize::MAX))
}

/// The processor's resized size in merged patches (rows, columns): `smart_resize` with
/// factor `patch * merge`, divided by that factor.
pub(crate) fn qwen_tokens_grid(
    processor: &QwenProcessor,
    height: u64,
    width: u64,
) -> Result<(u64, u64), VisionError> {
    let factor = processor.patch_size * processor.merge_size;
    let (h, w) = hf_smart_resize(
        height,
        width,
        factor,
        processor.min_pixels,
        processor.max_pixels,
    )?;
    Ok((h / factor, w / factor))
}

/// transformers 5.19's `smart_resize` (Qwen2-VL's image processor).
pub(crate) fn hf_smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(u64, u64), VisionError> {
    check_ratio(height, width)?;
    let mut h = round_by_factor(height as f64, factor);
    let mut w = round_by_factor(width as f64, factor);
    if h.saturating_mul(w) > max_pixels {
        let beta = (height.saturating_mul(width) as f64 / max_pixels as f64).sqrt();
        h = floor_by_factor(height as f64 / beta, factor).max(factor);
        w = floor_by_factor(width as f64 / beta, factor).max(factor);
    } else if h.saturating_mul(w) < min_pixels {
        let beta = (min_pixels as f64 / height.saturating_mul(width) as f64).sqrt();
        h = ceil_by_factor(height as f64 * beta, factor);
        w = ceil_by_factor(width as f64 * beta, factor);
    }
    Ok((h, w))
}

/// Older SGLang's `resize_image` for Qwen-VL images: its own `smart_resize` (factor 28,
/// sides at least one factor before the pixel bounds; no floor to one factor after them).
pub(crate) fn pre_resize(height: u64, width: u64, cap: u64) -> Result<(u64, u64), VisionError> {
    check_ratio(height, width)?;
    let factor = PRE_RESIZE_FACTOR;
    let mut h = round_by_factor(height as f64, factor).max(factor);
    let mut w = round_by_factor(width as f64, factor).max(factor);
    if h.saturating_mul(w) > cap {
        let beta = (height.saturating_mul(width) as f64 / cap as f64).sqrt();
        h = floor_by_factor(height as f64 / beta, factor);
        w = floor_by_factor(width as f64 / beta, factor);
    } else if h.saturating_mul(w) < PRE_RESIZE_MIN_PIXELS {
        let beta = (PRE_RESIZE_MIN_PIXELS as f64 / height.saturating_mul(width) as f64).sqrt();
        h = ceil_by_factor(height as f64 * beta, factor);
        w = ceil_by_factor(width as f64 * beta, factor);
    }
    if h == 0 || w == 0 {
        // PIL refuses to resize to an empty image; SGLang returns its message.
        return Err(VisionError::Image(format!(
            "height and width must be > 0, got {h}x{w}"
        )));
    }
    Ok((h, w))
}

/// `max(h, w) / min(h, w) > MAX_RATIO` is a `ValueError` whose text shows the ratio as
/// Python prints a float.
fn check_ratio(height: u64, width: u64) -> Result<(), VisionError> {
    let ratio = height.max(width) as f64 / height.min(width) as f64;
    if ratio > MAX_RATIO {
        return Err(VisionError::AspectRatio(python_float(ratio)));
    }
    Ok(())
}

/// `round(x / factor) * factor` with Python's round (half to even).
fn round_by_factor(x: f64, factor: u64) -> u64 {
    to_u64((x / factor as f64).round_ties_even()) * factor
}

fn floor_by_factor(x: f64, factor: u64) -> u64 {
    to_u64((x / factor as f64).floor()) * factor
}

fn ceil_by_factor(x: f64, factor: u64) -> u64 {
    to_u64((x / factor as f64).ceil()) * factor
}

/// A non-negative whole float as an integer (saturating; the sizes here are far below).
fn to_u64(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x as u64
    } else {
        0
    }
}

/// A float as Python's `repr` prints it, for the magnitudes an aspect ratio has here (over
/// 200, below 1e16): the shortest round-trip digits, with `.0` on a whole number.
pub(crate) fn python_float(x: f64) -> String {
    let mut text = String::new();
    let _ = write!(text, "{x}");
    if x.is_finite() && !text.contains(['.', 'e', 'E']) {
        text.push_str(".0");
    }
    text
}

#[cfg(test)]
mod tests;
