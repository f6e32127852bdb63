//! Exact image token counts without decoding pixels (issue 41).
//!
//! A vision-language model replaces each image in a prompt with a number of soft tokens
//! that depends only on the image's width and height and on the engine's processor
//! settings. This module gives that number from the first bytes of the image file:
//!
//! 1. [`probe`] reads the width and height from a *prefix* of a PNG, JPEG, WebP or GIF file,
//!    the way Pillow's `Image.open` does (SGLang decodes every image with Pillow), and refuses
//!    decoding bombs before anything is allocated. A streaming fetcher calls it with growing
//!    prefixes until it answers [`Probe::Known`].
//! 2. [`VisionProcessor`] is built from the model's `preprocessor_config.json` and, for
//!    SGLang releases that pre-resized images, their pixel cap. [`VisionProcessor::image_tokens`]
//!    is the count the engine's HF image processor produces, and
//!    [`VisionProcessor::expansion`] is how the chat template's placeholder grows into it.
//!
//! The reference these are tested against is `tests/vision/reference.py` (the real HF image
//! processors of transformers 5.19.0 on real pixels) and its `tests/vision/fixtures.json`.

mod config;
mod error;
mod header;
mod pan_and_scan;
mod processor;
mod resize;

pub use error::{ImageError, VisionError};
pub use header::{
    probe, probe_file, ImageFormat, ImageInfo, Probe, MAX_IMAGE_PIXELS, MAX_PROBE_BYTES,
};
pub use processor::{Expansion, VisionFamily, VisionProcessor, SGLANG_LEGACY_DEFAULT_CAP};
pub use resize::{round_half_even_div, smart_resize, Resized};

#[cfg(test)]
mod tests;
