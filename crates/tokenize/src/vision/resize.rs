//! `smart_resize`: the size a Qwen-VL image is resized to, with Python's numerics.
//!
//! Two variants exist and differ on thin images:
//! - **HF** (`smart_resize` in `transformers/models/qwen2_vl/image_processing_pil_qwen2_vl.py`
//!   and, identical, `image_processing_qwen2_vl.py`, transformers 5.19.0): each side is rounded to
//!   a multiple of `factor`, possibly to 0, and the min-pixels branch then scales up from the
//!   original size; the max-pixels branch floors but keeps at least `factor`.
//! - **old SGLang** (`smart_resize` in `python/sglang/srt/multimodal/processors/qwen_vl.py`,
//!   SGLang 0.5.4 to 0.5.5.post1, applied to every image by `resize_image` before the HF
//!   processor): each rounded side is raised to `factor` first, and the max-pixels branch floors
//!   without that floor.
//!
//! Python's `round` is half-to-even, and `height / factor` is a true division: the rounding is
//! done here on the exact rational (equal to Python's result, since a float quotient of two
//! integers below 2^32 is never off by enough to cross a half). The square-root branches repeat
//! Python's float operations one for one (`sqrt`, `/`, `*`, `floor`, `ceil` are IEEE-754 in
//! both), so they round the same way; [`super::MAX_IMAGE_PIXELS`] keeps `height * width` exact
//! in a double.

use super::error::VisionError;

/// The largest ratio of the long side to the short side either variant accepts.
const MAX_RATIO: f64 = 200.0;

/// A resized image's height and width (multiples of the factor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resized {
    /// Height in pixels.
    pub height: u64,
    /// Width in pixels.
    pub width: u64,
}

/// `round(n / d)` with Python's half-to-even rule, in integers (`d > 0`).
pub fn round_half_even_div(n: u64, d: u64) -> u64 {
    let (q, r) = (n / d, n % d);
    // Compare 2r with d without overflow: r < d, so r >= d - r decides "at least half".
    let above_half = r > d - r;
    let exactly_half = r == d - r;
    if above_half || (exactly_half && q % 2 == 1) {
        q + 1
    } else {
        q
    }
}

/// HF's `smart_resize(height, width, factor, min_pixels, max_pixels)`.
pub fn smart_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<Resized, VisionError> {
    check_ratio(height, width)?;
    let mut h_bar = round_half_even_div(height, factor) * factor;
    let mut w_bar = round_half_even_div(width, factor) * factor;
    let area = h_bar.saturating_mul(w_bar);
    if area > max_pixels {
        let beta = (height as f64 * width as f64 / max_pixels as f64).sqrt();
        h_bar = factor.max(floor_div_float(height as f64 / beta, factor));
        w_bar = factor.max(floor_div_float(width as f64 / beta, factor));
    } else if area < min_pixels {
        let beta = (min_pixels as f64 / (height as f64 * width as f64)).sqrt();
        h_bar = ceil_div_float(height as f64 * beta, factor);
        w_bar = ceil_div_float(width as f64 * beta, factor);
    }
    Ok(Resized {
        height: h_bar,
        width: w_bar,
    })
}

/// Old SGLang's `smart_resize` (the pre-resize to `SGLANG_IMAGE_MAX_PIXELS`). It looks like
/// [`smart_resize`] but is not the same algorithm, and is kept apart on purpose: it raises each
/// rounded side to at least `factor` *before* comparing areas, and does not when scaling down
/// (so a thin image is 71 tokens here, 29 there).
pub(crate) fn sglang_legacy_resize(
    height: u64,
    width: u64,
    factor: u64,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<Resized, VisionError> {
    check_ratio(height, width)?;
    let mut h_bar = factor.max(round_half_even_div(height, factor) * factor);
    let mut w_bar = factor.max(round_half_even_div(width, factor) * factor);
    let area = h_bar.saturating_mul(w_bar);
    if area > max_pixels {
        let beta = (height as f64 * width as f64 / max_pixels as f64).sqrt();
        h_bar = floor_div_float(height as f64 / beta, factor);
        w_bar = floor_div_float(width as f64 / beta, factor);
    } else if area < min_pixels {
        let beta = (min_pixels as f64 / (height as f64 * width as f64)).sqrt();
        h_bar = ceil_div_float(height as f64 * beta, factor);
        w_bar = ceil_div_float(width as f64 * beta, factor);
    }
    Ok(Resized {
        height: h_bar,
        width: w_bar,
    })
}

/// `if max(h, w) / min(h, w) > 200: raise ValueError(...)`, both variants' first step.
fn check_ratio(height: u64, width: u64) -> Result<(), VisionError> {
    let (long, short) = (height.max(width), height.min(width));
    if short == 0 {
        return Err(VisionError::EmptyImage {
            width: u32::try_from(width).unwrap_or(u32::MAX),
            height: u32::try_from(height).unwrap_or(u32::MAX),
        });
    }
    let ratio = long as f64 / short as f64;
    if ratio > MAX_RATIO {
        return Err(VisionError::AspectRatio { ratio });
    }
    Ok(())
}

/// `math.floor(x / factor) * factor` for a non-negative float `x`.
fn floor_div_float(x: f64, factor: u64) -> u64 {
    // `as` saturates; x is at most a side length here, far below u64::MAX.
    (x / factor as f64).floor() as u64 * factor
}

/// `math.ceil(x / factor) * factor` for a non-negative float `x`.
fn ceil_div_float(x: f64, factor: u64) -> u64 {
    (x / factor as f64).ceil() as u64 * factor
}
