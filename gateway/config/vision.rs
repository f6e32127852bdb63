//! Images (issue 41): `[models.vision]`, the model's image processor, and `[pools.images]`,
//! what one pool's engines do with images (their pre-resize cap) and where kvgate may read
//! them from (remote URLs only when the pool allows it).

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::resolve;
use super::invalid::Invalid;
use kvgate_tokenize::vision::{VisionFamily, VisionProcessor};

/// `[models.vision]`: the model takes images; each is counted as its engine's image
/// processor sizes it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VisionConfig {
    /// `qwen2_vl` (Qwen2-VL and Qwen2.5-VL), `qwen3_vl` or `gemma3`.
    pub family: VisionFamilyName,
    /// The model's `preprocessor_config.json` (relative to the config file): its patch and
    /// pixel bounds decide each image's size in tokens.
    pub preprocessor_config: PathBuf,
    /// Most images in one request: each costs a header read (a fetch for a remote one).
    #[serde(default = "default_max_images")]
    pub max_images: usize,
    /// Longest `data:` URL accepted, in bytes of its base64 text.
    #[serde(default = "default_max_inline_bytes")]
    pub max_inline_bytes: bytesize::ByteSize,
}

fn default_max_images() -> usize {
    16
}

fn default_max_inline_bytes() -> bytesize::ByteSize {
    bytesize::ByteSize::mib(20)
}

/// The image processor families, as the config names them.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum VisionFamilyName {
    /// Qwen2-VL and Qwen2.5-VL.
    #[serde(alias = "qwen2_5_vl")]
    Qwen2Vl,
    Qwen3Vl,
    Gemma3,
}

impl VisionFamilyName {
    pub fn family(self) -> VisionFamily {
        match self {
            VisionFamilyName::Qwen2Vl => VisionFamily::Qwen2Vl,
            VisionFamilyName::Qwen3Vl => VisionFamily::Qwen3Vl,
            VisionFamilyName::Gemma3 => VisionFamily::Gemma3,
        }
    }
}

impl VisionConfig {
    /// Its file resolved against `base` and read as the family's processor reads it.
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        resolve(base, &mut self.preprocessor_config, "preprocessor_config")?;
        self.processor(None)?;
        if self.max_images == 0 {
            return Err(Invalid::new(
                "max_images",
                "must be at least 1 (leave [models.vision] out for a text-only model)",
            ));
        }
        Ok(())
    }

    /// The image processor, with an engine's pre-resize cap (`[pools.images]`).
    pub fn processor(&self, pre_resize_cap: Option<u64>) -> Result<VisionProcessor, Invalid> {
        VisionProcessor::from_file(self.family.family(), &self.preprocessor_config)
            .map(|p| p.with_pre_resize_cap(pre_resize_cap))
            .map_err(|e| {
                Invalid::new(
                    "preprocessor_config",
                    format!(
                        "{e}; it must be the model's own preprocessor_config.json (from its Hugging Face repository)"
                    ),
                )
            })
    }
}

/// `[pools.images]`: how this pool's engines size images, and whether kvgate may fetch an
/// image URL to count it.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolImagesConfig {
    /// Engines that resize every image to at most this many pixels before the model's
    /// processor (SGLang 0.5.4 to 0.5.5.post1, `SGLANG_IMAGE_MAX_PIXELS`, by default
    /// 12,845,056). Unset: current SGLang, where only the processor sizes images.
    #[serde(default)]
    pub pre_resize_max_pixels: Option<u64>,
    /// `https` (and `http` with `allow_http`) image URLs are fetched, their header only, to
    /// count them; the engine fetches them again itself. Off: only `data:` URLs.
    #[serde(default)]
    pub remote: bool,
    /// Plain `http://` image URLs too.
    #[serde(default)]
    pub allow_http: bool,
    /// Networks remote images may come from although they are private (an internal image
    /// store), e.g. "10.20.0.0/16". Loopback, private, link-local and metadata addresses
    /// are refused otherwise.
    #[serde(default)]
    pub allow_networks: Vec<String>,
    /// The whole fetch of one image's header, redirects included.
    #[serde(default = "default_fetch_timeout", with = "humantime_serde")]
    pub fetch_timeout: Duration,
    /// Most bytes read of one remote image (only its header is needed).
    #[serde(default = "default_max_fetch_bytes")]
    pub max_fetch_bytes: bytesize::ByteSize,
    #[serde(default = "default_max_redirects")]
    pub max_redirects: usize,
}

fn default_fetch_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_max_fetch_bytes() -> bytesize::ByteSize {
    bytesize::ByteSize::mib(4)
}

fn default_max_redirects() -> usize {
    3
}

impl PoolImagesConfig {
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.pre_resize_max_pixels == Some(0) {
            return Err(Invalid::new(
                "pre_resize_max_pixels",
                "must be the engine's pixel cap (e.g. 1003520), or left out for current SGLang",
            ));
        }
        if self.allow_http && !self.remote {
            return Err(Invalid::new(
                "allow_http",
                "has no effect without remote = true",
            ));
        }
        for (i, net) in self.allow_networks.iter().enumerate() {
            net.parse::<kvgate_image_source::IpCidr>().map_err(|e| {
                Invalid::new(
                    format!("allow_networks[{i}]"),
                    format!("`{net}`: {e}; write a network as \"10.20.0.0/16\" or one address"),
                )
            })?;
        }
        if self.remote && self.fetch_timeout.is_zero() {
            return Err(Invalid::new("fetch_timeout", "must be more than zero"));
        }
        Ok(())
    }

    /// The fetch policy of the pool's remote images.
    pub fn fetch_policy(&self) -> kvgate_image_source::FetchPolicy {
        kvgate_image_source::FetchPolicy {
            allowed: self.remote,
            allow_networks: self
                .allow_networks
                .iter()
                .filter_map(|n| n.parse().ok())
                .collect(),
            max_bytes: usize::try_from(self.max_fetch_bytes.as_u64()).unwrap_or(usize::MAX),
            timeout: self.fetch_timeout,
            max_redirects: self.max_redirects,
            allow_http: self.allow_http,
        }
    }
}
