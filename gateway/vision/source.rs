//! Each image of a request, read only as far as its size: a `data:` URL in place, a remote
//! URL through the pool's fetcher (`kvgate_image_source`: public addresses only, unless the
//! operator allow-listed a network; size and time capped; the connection dropped once the
//! header is read). A file whose header declares a decoding bomb is refused as soon as the
//! size is read, before anything is allocated for it.
//!
//! SGLang loads an image "URL" that is neither `data:` nor `http(s)://` as a file path on
//! the engine's host, or as bare base64 (sglang `srt/utils` `load_image`): kvgate refuses
//! both, so no client names a file on an engine's disk.

use serde_json::Value;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use super::ModelVision;
use kvgate_image_source::{read_image, DataUrl, Enough, ImageSourceError};
use kvgate_tokenize::vision::{probe, ImageError, ImageInfo, Probe};

/// One image, as far as counting and routing need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedImage {
    /// Its format and size, from its header.
    pub info: ImageInfo,
    /// A stable hash of the image (a `data:` URL's whole text; a remote image's URL and the
    /// bytes read of it): prefix routing hashes it in place of the image's tokens, so two
    /// different images of one size never look like one prefix.
    pub salt: u64,
    /// Fetched from a remote URL (the request then goes only to pools that fetch).
    pub remote: bool,
}

/// The images of one request, by their URL as the client wrote it.
pub type ResolvedImages = HashMap<String, ResolvedImage>;

/// Why an image of a request is refused (a 400 naming the part).
#[derive(Debug, thiserror::Error)]
pub enum ImageRefusal {
    #[error("{param}: {source}")]
    Source {
        param: String,
        #[source]
        source: ImageSourceError,
    },
    #[error("{param}: {reason}")]
    Image {
        param: String,
        reason: String,
        /// The refusal's metric label (`metrics::REASONS`).
        label: &'static str,
    },
    #[error("the request has {count} images; this model takes at most {max} per request")]
    TooMany { count: usize, max: usize },
    #[error("{param}: remote image URLs are not fetched for model `{model}` (its pools read `data:` URLs only); send the image inline as a data: URL")]
    RemoteOff { param: String, model: String },
}

impl ImageRefusal {
    /// Its label in `kvgate_image_refusals_total` (one of [`super::metrics::REASONS`]).
    pub fn reason(&self) -> &'static str {
        use kvgate_image_source::DataUrlError;
        match self {
            Self::Source {
                source: ImageSourceError::Data(e),
                ..
            } => match e {
                DataUrlError::NotDataUrl | DataUrlError::Malformed => "bad_url",
                _ => "bad_data",
            },
            Self::Source {
                source: ImageSourceError::Fetch(e),
                ..
            } => match e.code() {
                "forbidden_address" => "forbidden_address",
                "invalid_url" | "scheme" | "credentials" => "bad_url",
                "remote_disabled" => "remote_off",
                _ => "fetch_failed",
            },
            Self::Image { label, .. } => label,
            Self::TooMany { .. } => "too_many",
            Self::RemoteOff { .. } => "remote_off",
        }
    }

    /// The request field the refusal names.
    pub fn param(&self) -> &str {
        match self {
            Self::Source { param, .. }
            | Self::Image { param, .. }
            | Self::RemoteOff { param, .. } => param,
            Self::TooMany { .. } => "messages",
        }
    }
}

/// The `image_url` parts of `messages` (`[{role, content: [parts]}]`): each URL with the
/// field that holds it, in message order.
pub fn image_urls(messages: &Value) -> Vec<(String, &str)> {
    let mut urls = Vec::new();
    let Some(messages) = messages.as_array() else {
        return urls;
    };
    for (i, message) in messages.iter().enumerate() {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (j, part) in parts.iter().enumerate() {
            if part.get("type").and_then(Value::as_str) != Some("image_url") {
                continue;
            }
            if let Some(url) = part
                .get("image_url")
                .and_then(|u| u.get("url"))
                .and_then(Value::as_str)
            {
                urls.push((format!("messages[{i}].content[{j}].image_url.url"), url));
            }
        }
    }
    urls
}

/// Read the size of every image `messages` names, for a request that may go to `pools`:
/// remote images only through the first of them that fetches (`None` of them: refused).
pub async fn resolve_images(
    vision: &ModelVision,
    model: &str,
    messages: &Value,
    pools: &[&str],
) -> Result<ResolvedImages, ImageRefusal> {
    let resolved = read_all(vision, model, messages, pools).await;
    match &resolved {
        Ok(images) => {
            for image in images.values() {
                super::metrics::counted(model, image.remote);
            }
        }
        Err(refusal) => super::metrics::refused(model, refusal.reason()),
    }
    resolved
}

async fn read_all(
    vision: &ModelVision,
    model: &str,
    messages: &Value,
    pools: &[&str],
) -> Result<ResolvedImages, ImageRefusal> {
    let urls = image_urls(messages);
    if urls.len() > vision.max_images {
        return Err(ImageRefusal::TooMany {
            count: urls.len(),
            max: vision.max_images,
        });
    }
    let fetching = pools.iter().find(|p| vision.fetches(p));
    let mut resolved = ResolvedImages::with_capacity(urls.len());
    for (param, url) in urls {
        if resolved.contains_key(url) {
            continue;
        }
        let inline = DataUrl::is_data_url(url);
        let fetcher = match (inline, fetching) {
            (true, _) => vision.refusing_fetcher(),
            (false, Some(pool)) => vision.fetcher(pool),
            (false, None) if url.starts_with("http://") || url.starts_with("https://") => {
                return Err(ImageRefusal::RemoteOff {
                    param,
                    model: model.to_owned(),
                })
            }
            (false, None) => return Err(ImageRefusal::Image {
                param,
                reason:
                    "an image must be a data: URL (data:image/png;base64,...) or an https:// URL"
                        .into(),
                label: "bad_url",
            }),
        };
        let mut info = None;
        let mut refused = None;
        let read = read_image(url, &vision.inline, fetcher, |bytes: &[u8]| {
            match probe(bytes) {
                Probe::Known(i) => {
                    info = Some(i);
                    Enough::Yes
                }
                Probe::NeedMore { at_least } => Enough::NeedMore { at_least },
                Probe::Invalid(e) => {
                    let reason = e.to_string();
                    refused = Some(e);
                    Enough::Stop(reason)
                }
            }
        })
        .await;
        let prefix = match read {
            Ok(prefix) => prefix,
            Err(source) => {
                return Err(match refused {
                    Some(e) => invalid(param, &e),
                    None => ImageRefusal::Source { param, source },
                })
            }
        };
        let info = match info {
            Some(info) => info,
            // The file ended before its size: the closure never said Yes.
            None => match probe(&prefix.bytes) {
                Probe::Known(i) => i,
                Probe::Invalid(e) => return Err(invalid(param, &e)),
                Probe::NeedMore { .. } => {
                    return Err(ImageRefusal::Image {
                        param,
                        reason: "the image ends before its header says its size".into(),
                        label: "not_an_image",
                    })
                }
            },
        };
        let salt = salt_of(url, &prefix.bytes, inline);
        resolved.insert(
            url.to_owned(),
            ResolvedImage {
                info,
                salt,
                remote: !inline,
            },
        );
    }
    Ok(resolved)
}

/// A hash that is the same on every replica (prefix routing may share its index): the
/// whole text of an inline image; a remote image's URL and its header bytes.
fn salt_of(url: &str, header: &[u8], inline: bool) -> u64 {
    let mut hasher = foldhash::fast::FixedState::with_seed(0x6b76_6761_7465_696d).build_hasher();
    hasher.write(url.as_bytes());
    if !inline {
        hasher.write(header);
    }
    hasher.finish()
}

/// The refusal of a file that is not an image the engine would open, or a decoding bomb.
fn invalid(param: String, e: &ImageError) -> ImageRefusal {
    ImageRefusal::Image {
        param,
        reason: e.to_string(),
        label: match e {
            ImageError::TooLarge { .. } => "too_large",
            _ => "not_an_image",
        },
    }
}
