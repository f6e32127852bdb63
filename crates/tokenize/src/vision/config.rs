//! The fields of a model's `preprocessor_config.json` that decide an image's token count.
//!
//! HF files carry many more keys (normalisation, resampling, processor class); those change
//! pixels, not counts, and are ignored. A key set to `null` counts as absent, as in HF.

use serde::Deserialize;

use super::error::VisionError;

/// `preprocessor_config.json`, the count-relevant part.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RawPreprocessorConfig {
    pub patch_size: Option<u64>,
    pub merge_size: Option<u64>,
    pub temporal_patch_size: Option<u64>,
    pub min_pixels: Option<u64>,
    pub max_pixels: Option<u64>,
    pub size: Option<RawSize>,
    pub image_seq_length: Option<u32>,
    pub mm_tokens_per_image: Option<u32>,
    pub do_pan_and_scan: Option<bool>,
    pub pan_and_scan_min_crop_size: Option<u32>,
    pub pan_and_scan_max_num_crops: Option<u32>,
    pub pan_and_scan_min_ratio_to_activate: Option<f64>,
}

/// `size`: Qwen-VL's pixel bounds (`shortest_edge`/`longest_edge` are *areas* there, not edges)
/// or Gemma 3's fixed `height`/`width`.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RawSize {
    pub shortest_edge: Option<u64>,
    pub longest_edge: Option<u64>,
}

impl RawPreprocessorConfig {
    pub(crate) fn parse(json: &str) -> Result<Self, VisionError> {
        serde_json::from_str(json).map_err(|e| VisionError::Config(e.to_string()))
    }
}
