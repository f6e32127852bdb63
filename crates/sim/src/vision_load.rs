//! Loading a chat's images as SGLang does (sglang 0.5.23 `srt/utils/common.py`
//! `load_image` / `get_image_bytes` / `_load_image`), up to what the sim needs: each
//! image's width and height.
//!
//! - `data:...,<base64>`: the text after the first comma, base64-decoded strictly
//!   (`pybase64.b64decode(validate=True)`); a url that is no URL at all is decoded as raw
//!   base64 the same way.
//! - `http://`: fetched with a plain GET before the request is parsed ([`prefetch`]),
//!   within SGLang's `REQUEST_TIMEOUT` default of 3 s. The sim is a test engine: it has no
//!   TLS client, so `https://` is refused (as are `file://` and paths) with SGLang's error
//!   shape and a message that says why.
//! - the bytes must be an image PIL can open: the sim reads only the header (the
//!   `imagesize` crate: PNG, JPEG, GIF, WebP, BMP, TIFF, ICO), not kvgate's own parser, and
//!   answers "Could not decode image: ..." as `_load_image` does for anything else. PIL's
//!   decompression-bomb limit (`2 * MAX_IMAGE_PIXELS` = 178956970 pixels) is an error too.
//!   The stored size is the size: neither PIL's `open` nor SGLang applies EXIF rotation.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use super::bootstrap::BootstrapClient;
use super::vision::VisionError;

/// SGLang's `REQUEST_TIMEOUT` default for media downloads.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest image body the sim downloads.
const MAX_DOWNLOAD_BYTES: usize = 64 << 20;
/// PIL's `Image.MAX_IMAGE_PIXELS` (`1024 * 1024 * 1024 // 4 // 3`); twice it is an error.
const PIL_MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// The `http://` images of a request, fetched before its parse: url → bytes or the error.
#[derive(Debug, Default)]
pub(crate) struct Fetched(HashMap<String, Result<Bytes, String>>);

impl Fetched {
    /// Nothing fetched (a request without http images, or a caller that fetches none).
    pub(crate) fn none() -> Self {
        Self::default()
    }
}

/// Fetches every `http://` image url in `body`'s messages (each once).
pub(crate) async fn prefetch(client: &BootstrapClient, body: &Value) -> Fetched {
    let mut fetched = HashMap::new();
    for url in http_image_urls(body) {
        if fetched.contains_key(&url) {
            continue;
        }
        let result = download(client, &url).await;
        fetched.insert(url, result);
    }
    Fetched(fetched)
}

/// The `image_url.url`s of `body`'s content parts that start with `http://`.
fn http_image_urls(body: &Value) -> Vec<String> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    messages
        .iter()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("image_url"))
        .filter_map(|p| p.get("image_url")?.get("url")?.as_str())
        .filter(|url| url.starts_with("http://"))
        .map(str::to_owned)
        .collect()
}

async fn download(client: &BootstrapClient, url: &str) -> Result<Bytes, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("Invalid URL {url}: {e}"))?;
    let call = async {
        let response = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!(
                "{} Error: {} for url: {url}",
                status.as_u16(),
                status.canonical_reason().unwrap_or("")
            ));
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_DOWNLOAD_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(body.to_bytes())
    };
    tokio::time::timeout(DOWNLOAD_TIMEOUT, call)
        .await
        .map_err(|_| format!("Read timed out while downloading {url}"))?
}

/// The bytes of the image at `url` (see the module docs for which urls load).
pub(crate) fn image_bytes(url: &str, fetched: &Fetched) -> Result<Vec<u8>, VisionError> {
    if url.starts_with("http://") {
        return match fetched.0.get(url) {
            Some(Ok(bytes)) => Ok(bytes.to_vec()),
            Some(Err(e)) => Err(VisionError::Image(e.clone())),
            None => Err(VisionError::Image(format!(
                "the simulated engine did not fetch {url}"
            ))),
        };
    }
    if url.starts_with("https://") || url.starts_with("file://") || url.starts_with('/') {
        return Err(VisionError::Image(format!(
            "the simulated engine loads only data: and http:// images, not {}",
            url.chars().take(64).collect::<String>()
        )));
    }
    let encoded = match url.strip_prefix("data:") {
        Some(rest) => match rest.split_once(',') {
            Some((_, encoded)) => encoded,
            None => {
                return Err(VisionError::Image(
                    "not enough values to unpack (expected 2, got 1)".into(),
                ))
            }
        },
        None => url,
    };
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|e| VisionError::Image(format!("Invalid base64-encoded string: {e}")))
}

/// An image's (width, height), read from its header.
pub(crate) fn image_size(bytes: &[u8]) -> Result<(u64, u64), VisionError> {
    let size = imagesize::blob_size(bytes).map_err(|e| {
        VisionError::Image(format!(
            "Could not decode image: cannot identify image file ({e})"
        ))
    })?;
    let mut width = u64::try_from(size.width).unwrap_or(u64::MAX);
    let mut height = u64::try_from(size.height).unwrap_or(u64::MAX);
    if let Some((right, bottom)) = gif_first_frame_extent(bytes) {
        // PIL's GIF plugin grows `size` to the first frame when it sticks out of the
        // logical screen (`GifImagePlugin._seek`); `imagesize` reports the screen.
        width = width.max(right);
        height = height.max(bottom);
    }
    let pixels = width.max(1).saturating_mul(height.max(1));
    if pixels > 2 * PIL_MAX_IMAGE_PIXELS {
        return Err(VisionError::Image(format!(
            "Image size ({pixels} pixels) exceeds limit of {} pixels, could be decompression bomb DOS attack.",
            2 * PIL_MAX_IMAGE_PIXELS
        )));
    }
    Ok((width, height))
}

/// A GIF's first frame's right and bottom edges (left + width, top + height), from its
/// image descriptor, skipping the colour table and extension blocks before it.
fn gif_first_frame_extent(bytes: &[u8]) -> Option<(u64, u64)> {
    if !(bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a")) {
        return None;
    }
    let flags = *bytes.get(10)?;
    let mut at = 13usize;
    if flags & 0x80 != 0 {
        at += 3 << ((flags & 7) + 1);
    }
    loop {
        match *bytes.get(at)? {
            0x2c => {
                let word = |i: usize| -> Option<u64> {
                    let lo = *bytes.get(at + i)?;
                    let hi = *bytes.get(at + i + 1)?;
                    Some(u64::from(u16::from_le_bytes([lo, hi])))
                };
                return Some((word(1)? + word(5)?, word(3)? + word(7)?));
            }
            0x21 => {
                // An extension: its label, then sub-blocks until an empty one.
                at += 2;
                loop {
                    let len = usize::from(*bytes.get(at)?);
                    at += 1 + len;
                    if len == 0 {
                        break;
                    }
                }
            }
            _ => return None,
        }
    }
}
