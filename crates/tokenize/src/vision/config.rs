//! The fields of a model's `preprocessor_config.json` that decide an image's token count.
//!
//! [`RawPreprocessorConfig`] is the file; [`Params`] what the family's HF processor makes of it.
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

/// What a family's HF image processor takes from the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Params {
    /// Qwen-VL's resize bounds and patching.
    Qwen {
        patch_size: u64,
        merge_size: u64,
        min_pixels: u64,
        max_pixels: u64,
    },
    /// Gemma 3's soft tokens per image and pan-and-scan (None: off).
    Gemma3 {
        image_seq_length: u32,
        pan_and_scan: Option<PanAndScan>,
    },
}

/// Gemma 3's pan-and-scan options (`Gemma3ImageProcessor.pan_and_scan`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PanAndScan {
    pub min_crop_size: u32,
    pub max_num_crops: u32,
    pub min_ratio_to_activate: f64,
}

/// Qwen2VLImageProcessor's `__init__` (transformers 5.19.0): `size` replaces the class default
/// `{shortest_edge: 56 * 56, longest_edge: 28 * 28 * 1280}` whole, then top-level `min_pixels`
/// / `max_pixels` override its keys; `resize` refuses a `size` without both.
pub(crate) fn qwen_params(raw: &RawPreprocessorConfig) -> Result<Params, VisionError> {
    let (mut min_pixels, mut max_pixels) = match &raw.size {
        None => (Some(56 * 56), Some(28 * 28 * 1280)),
        Some(size) => (size.shortest_edge, size.longest_edge),
    };
    if raw.min_pixels.is_some() {
        min_pixels = raw.min_pixels;
    }
    if raw.max_pixels.is_some() {
        max_pixels = raw.max_pixels;
    }
    let (Some(min_pixels @ 1..), Some(max_pixels @ 1..)) = (min_pixels, max_pixels) else {
        return Err(VisionError::Setting {
            field: "size",
            reason: "must contain non-zero 'shortest_edge' and 'longest_edge'",
        });
    };
    let patch_size = plausible(raw.patch_size.unwrap_or(14), "patch_size")?;
    let merge_size = plausible(raw.merge_size.unwrap_or(2), "merge_size")?;
    plausible(raw.temporal_patch_size.unwrap_or(2), "temporal_patch_size")?;
    Ok(Params::Qwen {
        patch_size,
        merge_size,
        min_pixels,
        max_pixels,
    })
}

/// Gemma3Processor's `image_seq_length` (default 256; `processor_config.json` and the model's
/// `preprocessor_config.json` both carry it, `config.json` calls it `mm_tokens_per_image`) and
/// the pan-and-scan options with `Gemma3ProcessorKwargs`' defaults (off, 256, 4, 1.2).
pub(crate) fn gemma3_params(raw: &RawPreprocessorConfig) -> Result<Params, VisionError> {
    let image_seq_length = raw
        .image_seq_length
        .or(raw.mm_tokens_per_image)
        .unwrap_or(256);
    if image_seq_length == 0 {
        return Err(VisionError::Setting {
            field: "image_seq_length",
            reason: "must be positive",
        });
    }
    let pan_and_scan = raw.do_pan_and_scan.unwrap_or(false).then(|| PanAndScan {
        min_crop_size: raw.pan_and_scan_min_crop_size.unwrap_or(256),
        max_num_crops: raw.pan_and_scan_max_num_crops.unwrap_or(4),
        min_ratio_to_activate: raw.pan_and_scan_min_ratio_to_activate.unwrap_or(1.2),
    });
    Ok(Params::Gemma3 {
        image_seq_length,
        pan_and_scan,
    })
}

/// A patch or merge size in 1..=1024: real models use 14 to 16 and 2, and the bound keeps
/// `patch_size * merge_size` and every product of the resize far from overflow.
fn plausible(value: u64, field: &'static str) -> Result<u64, VisionError> {
    if !(1..=1024).contains(&value) {
        return Err(VisionError::Setting {
            field,
            reason: "must be between 1 and 1024",
        });
    }
    Ok(value)
}
