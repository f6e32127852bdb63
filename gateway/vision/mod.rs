//! Images admitted exactly (issue 41): what kvgate knows of a vision model's images before
//! any byte goes downstream.
//!
//! An image part is counted as its engine counts it: the image's size is read from its
//! header (no pixel is decoded), from a `data:` URL in place or from a remote URL when the
//! pool allows it ([`source`]); the model's image processor (`kvgate_tokenize::vision`)
//! turns the size into the tokens the engine puts in place of the chat template's
//! placeholder, and [`expand`] puts them into the rendered prompt, so the prompt counts,
//! the limits, the guard's check and prefix routing all see the engine's own prompt.
//!
//! One [`ModelVision`] per model with `[models.vision]`: its processor for each
//! pre-resize cap its pools name, and each pool's fetch policy for remote images.

mod chat;
mod expand;
pub mod metrics;
mod source;

#[cfg(test)]
mod tests;

pub use chat::{may_hold_images, ChatImages};
pub use expand::{expand_images, salt_image_ids, ImageSalts};
pub use source::{resolve_images, ImageRefusal, ResolvedImage, ResolvedImages};

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, ModelConfig};
use kvgate_image_source::{DataUrlLimits, ImageFetcher};
use kvgate_tokenize::vision::{VisionFamily, VisionProcessor};

/// What admission knows of one vision model's images.
#[derive(Debug)]
pub struct ModelVision {
    family: VisionFamily,
    /// The processor as each pre-resize cap of the model's pools changes it (`None`: the
    /// processor alone, current SGLang).
    processors: Vec<(Option<u64>, VisionProcessor)>,
    /// Each pool's fetcher; a pool without remote images has one that refuses.
    fetchers: HashMap<Arc<str>, Arc<ImageFetcher>>,
    /// The fetcher of a request no pool of which fetches (refuses every remote URL).
    refusing: Arc<ImageFetcher>,
    pub(crate) inline: DataUrlLimits,
    pub(crate) max_images: usize,
}

impl ModelVision {
    /// The vision of every model of `config` that takes images.
    pub fn from_config(config: &Config) -> Result<HashMap<String, Arc<ModelVision>>, String> {
        config
            .models
            .iter()
            .filter(|m| m.vision.is_some())
            .map(|m| Ok((m.name.clone(), Arc::new(Self::of_model(config, m)?))))
            .collect()
    }

    fn of_model(config: &Config, model: &ModelConfig) -> Result<Self, String> {
        let Some(vision) = &model.vision else {
            return Err(format!("model `{}` takes no images", model.name));
        };
        let pools = config.pools.iter().filter(|p| p.model == model.name);
        let mut processors: Vec<(Option<u64>, VisionProcessor)> = Vec::new();
        let mut fetchers = HashMap::new();
        for pool in pools {
            let cap = pool.images.pre_resize_max_pixels;
            if !processors.iter().any(|(c, _)| *c == cap) {
                let processor = vision
                    .processor(cap)
                    .map_err(|e| format!("models.{}.vision.{}: {}", model.name, e.key, e.reason))?;
                processors.push((cap, processor));
            }
            let fetcher = ImageFetcher::new(pool.images.fetch_policy())
                .map_err(|e| format!("pool `{}`: remote images: {e}", pool.name))?;
            fetchers.insert(Arc::from(pool.name.as_str()), Arc::new(fetcher));
        }
        let refusing = ImageFetcher::new(kvgate_image_source::FetchPolicy::default())
            .map_err(|e| format!("model `{}`: {e}", model.name))?;
        Ok(Self {
            family: vision.family.family(),
            processors,
            fetchers,
            refusing: Arc::new(refusing),
            inline: DataUrlLimits {
                max_encoded_len: usize::try_from(vision.max_inline_bytes.as_u64())
                    .unwrap_or(usize::MAX),
            },
            max_images: vision.max_images,
        })
    }

    /// The model's family (placeholders, image tokens).
    pub fn family(&self) -> VisionFamily {
        self.family
    }

    /// The processor of engines with pre-resize cap `cap`.
    pub fn processor(&self, cap: Option<u64>) -> Option<&VisionProcessor> {
        self.processors
            .iter()
            .find(|(c, _)| *c == cap)
            .map(|(_, p)| p)
    }

    /// The fetcher of `pool` (one that refuses every remote URL when the pool is unknown).
    pub fn fetcher(&self, pool: &str) -> &Arc<ImageFetcher> {
        self.fetchers.get(pool).unwrap_or(&self.refusing)
    }

    /// The fetcher that refuses every remote URL: the one a `data:` URL is read with.
    pub fn refusing_fetcher(&self) -> &Arc<ImageFetcher> {
        &self.refusing
    }

    /// Whether `pool` fetches remote images.
    pub fn fetches(&self, pool: &str) -> bool {
        self.fetchers.get(pool).is_some_and(|f| f.policy().allowed)
    }
}
