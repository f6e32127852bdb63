//! Image token counts per model family, as SGLang's image processors produce them.
//!
//! - **Qwen2-VL / Qwen2.5-VL / Qwen3-VL**: SGLang hands the image to the model's HF image
//!   processor (`Qwen2VLImageProcessor`, also Qwen3-VL's, transformers 5.19.0
//!   `models/qwen2_vl/image_processing_pil_qwen2_vl.py` `_preprocess`): the image is resized by
//!   `smart_resize` with `factor = patch_size * merge_size`, the grid is
//!   `[1, h / patch_size, w / patch_size]` and the pad count is `grid_h * grid_w / merge_size^2`
//!   (`processing_qwen2_vl.py` / `processing_qwen3_vl.py` `__call__`). SGLang 0.5.4 to
//!   0.5.5.post1 first resized every image with its own `smart_resize` (factor 28,
//!   `min_pixels = 4 * 28 * 28`, `max_pixels = SGLANG_IMAGE_MAX_PIXELS`, default `16384 * 28 *
//!   28`) in `resize_image` (`python/sglang/srt/multimodal/processors/qwen_vl.py`, called from
//!   `process_mm_data_async` for every `PIL.Image`); 0.5.5.post2 and later do not
//!   ([`VisionProcessor::with_pre_resize_cap`]).
//! - **Gemma 3**: every image is resized to 896x896 and becomes `image_seq_length` (256) soft
//!   tokens; with pan-and-scan, each crop adds as many (transformers 5.19.0
//!   `models/gemma3/processing_gemma3.py` `replace_image_token`,
//!   `image_processing_pil_gemma3.py` `pan_and_scan`). SGLang 0.5.23
//!   (`multimodal/processors/gemma3.py`) passes no pan-and-scan option, so the processor's
//!   defaults and the model's `preprocessor_config.json` decide.

use std::path::Path;

use super::config::{gemma3_params, qwen_params, Params, RawPreprocessorConfig};
use super::error::VisionError;
use super::header::ImageInfo;
use super::resize::{sglang_legacy_resize, smart_resize};

/// `SGLANG_IMAGE_MAX_PIXELS`' default, `16384 * 28 * 28` (`python/sglang/srt/environ.py`,
/// SGLang 0.5.4 to 0.5.23): the cap old releases pre-resized every Qwen-VL image to.
pub const SGLANG_LEGACY_DEFAULT_CAP: u64 = 16384 * 28 * 28;

/// Old SGLang's pre-resize factor and lower bound (`IMAGE_FACTOR`, `MIN_PIXELS` in
/// `multimodal/processors/qwen_vl.py`, SGLang 0.5.4), the same for Qwen3-VL's 32-pixel grid.
const LEGACY_FACTOR: u64 = 28;
const LEGACY_MIN_PIXELS: u64 = 4 * 28 * 28;

/// The model families whose image token counts kvgate knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VisionFamily {
    /// Qwen2-VL and Qwen2.5-VL (14-pixel patches, 2x2 merge).
    Qwen2Vl,
    /// Qwen3-VL (16-pixel patches, 2x2 merge).
    Qwen3Vl,
    /// Gemma 3 (SigLIP at 896x896, 256 soft tokens per image).
    Gemma3,
}

impl VisionFamily {
    /// What the model's chat template writes for one image part.
    pub fn placeholder(self) -> &'static str {
        match self {
            VisionFamily::Qwen2Vl | VisionFamily::Qwen3Vl => {
                "<|vision_start|><|image_pad|><|vision_end|>"
            }
            VisionFamily::Gemma3 => "<start_of_image>",
        }
    }

    /// The token the vision tower's output replaces, repeated once per image token.
    pub fn image_token(self) -> &'static str {
        match self {
            VisionFamily::Qwen2Vl | VisionFamily::Qwen3Vl => "<|image_pad|>",
            VisionFamily::Gemma3 => "<image_soft_token>",
        }
    }
}

/// How one image's placeholder grows in the prompt text before it is tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expansion {
    /// What the chat template wrote ([`VisionFamily::placeholder`]).
    pub placeholder: &'static str,
    /// What the engine puts in its place. Qwen: `<|vision_start|>`, `image_tokens` pads,
    /// `<|vision_end|>` (special tokens, so text or id expansion give the same ids). Gemma 3:
    /// `\n\n<start_of_image>`, the soft tokens, `<end_of_image>\n\n`, in the *text*, so those
    /// newlines merge with the text around the placeholder when it is tokenized.
    pub replacement: String,
    /// How many image tokens `replacement` holds.
    pub image_tokens: u32,
}

/// An engine's image processor for one model: counts image tokens from the image's size.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionProcessor {
    family: VisionFamily,
    params: Params,
    pre_resize_cap: Option<u64>,
}

// === impl VisionProcessor ===

impl VisionProcessor {
    /// Builds the processor from the text of the model's `preprocessor_config.json`, reading it
    /// the way the family's HF image processor does (transformers 5.19.0).
    pub fn new(family: VisionFamily, preprocessor_config: &str) -> Result<Self, VisionError> {
        let raw = RawPreprocessorConfig::parse(preprocessor_config)?;
        let params = match family {
            VisionFamily::Qwen2Vl | VisionFamily::Qwen3Vl => qwen_params(&raw)?,
            VisionFamily::Gemma3 => gemma3_params(&raw)?,
        };
        Ok(Self {
            family,
            params,
            pre_resize_cap: None,
        })
    }

    /// [`VisionProcessor::new`] from a file.
    pub fn from_file(family: VisionFamily, path: &Path) -> Result<Self, VisionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| VisionError::Config(format!("{}: {e}", path.display())))?;
        Self::new(family, &text)
    }

    /// Models SGLang 0.5.4 to 0.5.5.post1, which pre-resized every Qwen-VL image to at most
    /// `cap` pixels (`SGLANG_IMAGE_MAX_PIXELS`, default [`SGLANG_LEGACY_DEFAULT_CAP`]) before
    /// the HF processor. `None` (the default) is current SGLang, which does not. Gemma 3 was
    /// never pre-resized, so the cap does not change its counts.
    pub fn with_pre_resize_cap(mut self, cap: Option<u64>) -> Self {
        self.pre_resize_cap = cap;
        self
    }

    /// The family this processor counts for.
    pub fn family(&self) -> VisionFamily {
        self.family
    }

    /// The number of image tokens the engine puts in place of the image's placeholder.
    pub fn image_tokens(&self, info: &ImageInfo) -> Result<u32, VisionError> {
        match &self.params {
            Params::Qwen {
                patch_size,
                merge_size,
                min_pixels,
                max_pixels,
            } => {
                let (mut height, mut width) = (u64::from(info.height), u64::from(info.width));
                if let Some(cap) = self.pre_resize_cap {
                    let pre =
                        sglang_legacy_resize(height, width, LEGACY_FACTOR, LEGACY_MIN_PIXELS, cap)?;
                    if pre.height == 0 || pre.width == 0 {
                        return Err(VisionError::PreResizeToZero { max_pixels: cap });
                    }
                    (height, width) = (pre.height, pre.width);
                }
                let factor = patch_size * merge_size;
                let resized = smart_resize(height, width, factor, *min_pixels, *max_pixels)?;
                let grid = (resized.height / patch_size).saturating_mul(resized.width / patch_size);
                u32::try_from(grid / (merge_size * merge_size)).map_err(|_| VisionError::Overflow)
            }
            Params::Gemma3 {
                image_seq_length,
                pan_and_scan,
            } => {
                let crops = pan_and_scan.map_or(0, |p| p.crops(info.width, info.height));
                image_seq_length
                    .checked_mul(crops.saturating_add(1))
                    .ok_or(VisionError::Overflow)
            }
        }
    }

    /// The placeholder's replacement for this image, and its image token count.
    pub fn expansion(&self, info: &ImageInfo) -> Result<Expansion, VisionError> {
        let image_tokens = self.image_tokens(info)?;
        let token = self.family.image_token();
        let replacement = match &self.params {
            Params::Qwen { .. } => {
                let mut text = String::from("<|vision_start|>");
                text.extend(std::iter::repeat_n(token, image_tokens as usize));
                text.push_str("<|vision_end|>");
                text
            }
            Params::Gemma3 {
                image_seq_length, ..
            } => {
                let mut full = String::from("\n\n<start_of_image>");
                full.extend(std::iter::repeat_n(token, *image_seq_length as usize));
                full.push_str("<end_of_image>\n\n");
                let crops = image_tokens / image_seq_length.max(&1) - 1;
                if crops == 0 {
                    full
                } else {
                    // `replace_image_token` with crops, word for word.
                    let copies = vec![full.as_str(); crops as usize].join(" ");
                    format!(
                        "Here is the original image {full} and here are some crops to help you \
                         see better {copies}"
                    )
                }
            }
        };
        Ok(Expansion {
            placeholder: self.family.placeholder(),
            replacement,
            image_tokens,
        })
    }
}
