//! Inline images: `data:[<mediatype>][;base64],<data>` (RFC 2397), read in place.
//!
//! Only base64 image data is taken: an image in percent-encoded form is not something
//! clients send, and refusing it with a clear reason beats guessing. The encoded length is
//! capped before anything else is looked at, the whole text is checked to be base64 by a
//! scan that allocates nothing, and only the prefix the caller asks for is decoded (base64
//! decodes in independent 4-character groups, so a prefix of groups is a prefix of bytes).

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;

use crate::enough::{Enough, Prefix};

#[cfg(test)]
mod tests;

/// Lenient where decoders in the wild are: Python's `base64.b64decode` ignores stray bits in
/// the last group, browsers' `atob` takes unpadded text. Refusing either here would refuse
/// images that engines and browsers read.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The longest media type and parameters taken (`image/png;name=cat.png;base64`): real ones
/// are a few dozen characters.
const MAX_HEADER: usize = 256;

/// The first read decodes this much: enough for most headers, cheap when it is not.
const FIRST_READ: usize = 1024;

/// Limits on inline images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataUrlLimits {
    /// The longest base64 text taken (the part after the comma), checked before anything is
    /// decoded or scanned.
    pub max_encoded_len: usize,
}

impl Default for DataUrlLimits {
    fn default() -> Self {
        // 20 MiB of base64 is a 15 MiB image, near OpenAI's 20 MB per image: real images
        // pass, and no request makes the gateway scan an unbounded string.
        Self {
            max_encoded_len: 20 << 20,
        }
    }
}

/// Why an inline image was refused. Each is a client error (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataUrlError {
    /// The URL does not start with `data:`.
    #[error("not a data: URL")]
    NotDataUrl,
    /// No comma separates the header from the data (within the header's 256 characters).
    #[error(
        "malformed data: URL: no comma after the media type (expected data:image/png;base64,...)"
    )]
    Malformed,
    /// The base64 text is longer than the cap.
    #[error("inline image too large: {len} base64 characters, at most {max} are accepted")]
    TooLong {
        /// Its length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// The media type is not `image/*`.
    #[error("data: URL is not an image: media type `{media_type}` (expected image/png, image/jpeg, ...)")]
    NotImage {
        /// The media type given (`text/plain` when none was).
        media_type: String,
    },
    /// The data is not marked `;base64`.
    #[error("inline image data must be base64-encoded: write data:{media_type};base64,<data>")]
    NotBase64 {
        /// The media type given.
        media_type: String,
    },
    /// The data is not valid base64.
    #[error("inline image is not valid base64: {reason} at character {at} of the data")]
    BadBase64 {
        /// The offset into the base64 text.
        at: usize,
        /// What is wrong there.
        reason: &'static str,
    },
    /// The caller refused the image (e.g. a decoding bomb).
    #[error("{0}")]
    Refused(String),
}

impl DataUrlError {
    /// A stable, low-cardinality label for metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotDataUrl => "not_data_url",
            Self::Malformed => "malformed",
            Self::TooLong { .. } => "too_long",
            Self::NotImage { .. } => "not_image",
            Self::NotBase64 { .. } => "not_base64",
            Self::BadBase64 { .. } => "bad_base64",
            Self::Refused(_) => "refused",
        }
    }
}

/// A checked inline image: an image media type and valid base64 text, not yet decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataUrl<'a> {
    media_type: &'a str,
    /// The base64 text, padding included.
    data: &'a [u8],
    /// Its length without padding.
    unpadded: usize,
}

// === impl DataUrl ===

impl<'a> DataUrl<'a> {
    /// Whether `url` is a `data:` URL at all (the scheme is case-insensitive).
    pub fn is_data_url(url: &str) -> bool {
        url.get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
    }

    /// Check `url`: a `data:` URL, within the cap, an image, base64, and valid base64
    /// throughout. Nothing is decoded.
    pub fn parse(url: &'a str, limits: &DataUrlLimits) -> Result<Self, DataUrlError> {
        if !Self::is_data_url(url) {
            return Err(DataUrlError::NotDataUrl);
        }
        let rest = &url[5..];
        // The comma is looked for in the header's room only, so that a long URL is refused
        // by its length alone, without a scan.
        let comma = rest.as_bytes()[..rest.len().min(MAX_HEADER + 1)]
            .iter()
            .position(|&b| b == b',')
            .ok_or(DataUrlError::Malformed)?;
        let (header, data) = (&rest[..comma], &rest[comma + 1..]);
        // First, before the data is scanned: the cap.
        if data.len() > limits.max_encoded_len {
            return Err(DataUrlError::TooLong {
                len: data.len(),
                max: limits.max_encoded_len,
            });
        }
        let mut params = header.split(';');
        let media_type = params.next().unwrap_or_default().trim();
        let is_base64 = params
            .next_back()
            .is_some_and(|p| p.trim().eq_ignore_ascii_case("base64"));
        let shown = if media_type.is_empty() {
            "text/plain" // RFC 2397's default
        } else {
            media_type
        };
        let is_image = media_type
            .get(..6)
            .is_some_and(|t| t.eq_ignore_ascii_case("image/"))
            && media_type.len() > 6;
        if !is_image {
            return Err(DataUrlError::NotImage {
                media_type: shown.into(),
            });
        }
        if !is_base64 {
            return Err(DataUrlError::NotBase64 {
                media_type: shown.into(),
            });
        }
        let unpadded = check_base64(data.as_bytes())?;
        Ok(Self {
            media_type,
            data: data.as_bytes(),
            unpadded,
        })
    }

    /// The media type as given (`image/png`).
    pub fn media_type(&self) -> &'a str {
        self.media_type
    }

    /// The length of the base64 text.
    pub fn encoded_len(&self) -> usize {
        self.data.len()
    }

    /// The length of the image once decoded, known without decoding.
    pub fn decoded_len(&self) -> usize {
        self.unpadded / 4 * 3 + (self.unpadded % 4).saturating_sub(1)
    }

    /// The first `len` bytes of the image (fewer when it is shorter), decoding only the
    /// 4-character groups they need.
    pub fn decode_prefix(&self, len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        self.decode_more(&mut out, len);
        // The last group may have decoded up to two bytes more than asked.
        out.truncate(len);
        out
    }

    /// Decode until `enough` says [`Enough::Yes`] (or the image ends), growing the prefix to
    /// what it asks for. Only that prefix (at most twice what was asked, rounded up to whole
    /// 3-byte groups) is ever decoded.
    pub fn read(&self, mut enough: impl FnMut(&[u8]) -> Enough) -> Result<Prefix, DataUrlError> {
        let total = self.decoded_len();
        let mut bytes = Vec::new();
        let mut target = FIRST_READ;
        loop {
            self.decode_more(&mut bytes, target);
            let complete = bytes.len() >= total;
            match enough(&bytes) {
                Enough::Yes => return Ok(Prefix { bytes, complete }),
                Enough::Stop(reason) => return Err(DataUrlError::Refused(reason)),
                Enough::NeedMore { .. } if complete => return Ok(Prefix { bytes, complete }),
                // Doubling bounds the closure's calls to a logarithm of the image size
                // when it under-asks, and guarantees progress when it asks for no more.
                Enough::NeedMore { at_least } => target = at_least.max(bytes.len() * 2),
            }
        }
    }

    /// Extend `out` (a prefix decoded by this function) to `len` bytes or the whole image.
    fn decode_more(&self, out: &mut Vec<u8>, len: usize) {
        let len = len.min(self.decoded_len());
        if out.len() >= len {
            return;
        }
        // `out` holds whole groups (3 bytes each) unless the image has ended.
        let from = out.len() / 3 * 4;
        let to = len.div_ceil(3).saturating_mul(4).min(self.unpadded);
        let Some(chunk) = self.data.get(from..to) else {
            return;
        };
        // Cannot fail: the text was checked in `parse`; a failure would leave a short
        // prefix, which the caller sees as a truncated image rather than a panic.
        if let Err(error) = LENIENT.decode_vec(chunk, out) {
            tracing::debug!(%error, "checked base64 failed to decode");
        }
    }
}

/// Check that `data` is base64 (standard alphabet, padding only at the end and only where
/// it belongs). Returns its length without padding.
fn check_base64(data: &[u8]) -> Result<usize, DataUrlError> {
    let unpadded = data.len()
        - data
            .iter()
            .rev()
            .take(2)
            .take_while(|&&b| b == b'=')
            .count();
    if let Some(at) = data[..unpadded]
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || b == b'+' || b == b'/'))
    {
        let reason = match data[at] {
            b'=' => "padding before the end",
            b'-' | b'_' => "a URL-safe base64 character (expected the standard alphabet)",
            b'%' => "percent-encoding (expected plain base64)",
            b if b.is_ascii_whitespace() => "whitespace",
            _ => "a character outside the base64 alphabet",
        };
        return Err(DataUrlError::BadBase64 { at, reason });
    }
    if unpadded % 4 == 1 {
        return Err(DataUrlError::BadBase64 {
            at: unpadded - 1,
            reason: "a length that no byte sequence encodes to",
        });
    }
    if unpadded < data.len() && data.len() % 4 != 0 {
        return Err(DataUrlError::BadBase64 {
            at: unpadded,
            reason: "padding that does not complete a group of four",
        });
    }
    Ok(unpadded)
}
