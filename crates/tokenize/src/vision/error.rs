//! Errors of the vision module: why an image's size or token count is not known.

use super::header::ImageFormat;

/// Why [`super::probe`] cannot give an image's size. Each one is a client error (HTTP 400):
/// the engine would refuse the same file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// The bytes start like none of the formats SGLang's loader takes (PNG, JPEG, WebP, GIF).
    #[error("unsupported image format (expected PNG, JPEG, WebP or GIF)")]
    UnknownFormat,
    /// The header breaks the format's rules (a bad chunk, a missing frame header, a zero side).
    #[error("corrupt {format} image: {reason}")]
    Corrupt {
        /// The format the signature announced.
        format: ImageFormat,
        /// What is wrong, in a few words.
        reason: &'static str,
    },
    /// A valid file that Pillow refuses to open (e.g. a 12-bit JPEG).
    #[error("unsupported {format} image: {reason}")]
    Unsupported {
        /// The format of the file.
        format: ImageFormat,
        /// What Pillow cannot handle.
        reason: &'static str,
    },
    /// More pixels than Pillow opens: its `DecompressionBombError` limit, so the engine refuses
    /// it too. Refused from the header, before any byte of pixel data is read.
    #[error("image size ({width}x{height} = {pixels} pixels) exceeds the limit of {limit} pixels")]
    TooLarge {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
        /// `width * height`.
        pixels: u64,
        /// [`super::MAX_IMAGE_PIXELS`].
        limit: u64,
    },
    /// The size was not found within [`super::MAX_PROBE_BYTES`] (metadata segments that long are
    /// not a real photo's; reading on would let a client make the gateway buffer without end).
    #[error("no {format} image size within the first {limit} bytes")]
    HeaderTooLong {
        /// The format of the file.
        format: ImageFormat,
        /// [`super::MAX_PROBE_BYTES`].
        limit: usize,
    },
    /// The whole file was read and it ended before its size.
    #[error("truncated {format} image: the file ends before its size")]
    Truncated {
        /// The format of the file.
        format: ImageFormat,
    },
}

/// Why a token count cannot be given for an image, or a processor not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VisionError {
    /// The HF processor's (and old SGLang's) aspect-ratio limit. The message is HF's own
    /// (`smart_resize` in `transformers/models/qwen2_vl/image_processing_pil_qwen2_vl.py`,
    /// transformers 5.19.0): the ratio printed as Python prints a float.
    #[error("absolute aspect ratio must be smaller than 200, got {ratio:?}")]
    AspectRatio {
        /// `max(h, w) / min(h, w)` as a Python float.
        ratio: f64,
    },
    /// A side is zero: there is nothing to resize.
    #[error("image has a zero side ({width}x{height})")]
    EmptyImage {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
    },
    /// The old SGLang pre-resize would shrink a side to zero pixels (only with a tiny cap):
    /// Pillow's `resize` refuses that.
    #[error("pre-resize to a {max_pixels}-pixel cap leaves a zero side")]
    PreResizeToZero {
        /// The cap that was applied.
        max_pixels: u64,
    },
    /// `preprocessor_config.json` is not valid JSON or has a field of the wrong type.
    #[error("invalid preprocessor_config.json: {0}")]
    Config(String),
    /// A processor setting that would make the count meaningless (a zero patch size, …).
    #[error("invalid vision processor setting {field}: {reason}")]
    Setting {
        /// The setting's name as it appears in `preprocessor_config.json`.
        field: &'static str,
        /// Why it cannot be used.
        reason: &'static str,
    },
    /// The count does not fit the engine's token ids (only for absurd settings).
    #[error("image token count overflows")]
    Overflow,
}
