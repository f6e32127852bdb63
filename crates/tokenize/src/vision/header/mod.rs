//! Image size from the first bytes of the file, without decoding pixels.
//!
//! The rules are Pillow's (`PIL/{Png,Jpeg,WebP,Gif}ImagePlugin.py`, Pillow 13.0.0): SGLang
//! opens every image with `PIL.Image.open` (`python/sglang/srt/utils/common.py` `_load_image`,
//! SGLang 0.5.23) and the HF image processor sizes what Pillow reports as `.size`.
//!
//! **EXIF orientation is not applied.** SGLang 0.5.23 calls `ImageOps.exif_transpose` only in
//! `smart_to_rgb`, which runs only for processors with `smart_rgb_conversion = True`
//! (`multimodal/processors/base_processor.py` `_load_single_item`; only GLM-4V sets it). The
//! Qwen-VL and Gemma 3 processors keep it `False`, and their JPEGs decoded on the GPU
//! (nvJPEG, `torchvision.io.decode_jpeg`) ignore the tag as well; HF's image processors do not
//! transpose either. So a JPEG is sized as stored, and the probe skips APP1 (EXIF) unread.
//! (For the families here it could not change a count anyway: Qwen's `smart_resize` and Gemma
//! 3's resize and pan-and-scan are symmetric in width and height.)

mod gif;
mod jpeg;
mod png;
mod webp;

use super::error::ImageError;

/// Pillow's `DecompressionBombError` limit, `2 * Image.MAX_IMAGE_PIXELS` =
/// `2 * (1024 * 1024 * 1024 // 4 // 3)` (`PIL/Image.py` `_decompression_bomb_check`, Pillow
/// 13.0.0). `Image.open` raises above it, so SGLang (which leaves the limit as it is for the
/// Qwen-VL and Gemma 3 processors) refuses these files: kvgate refuses them from the header.
/// It also keeps `width * height` below 2^53, so the float steps of `smart_resize` see exact
/// integers, as Python's do.
pub const MAX_IMAGE_PIXELS: u64 = 178_956_970;

/// How far into a file the probe looks for the size. A JPEG may put EXIF, ICC and XMP segments
/// (each at most 64 KiB) before its frame header, and a GIF extension blocks before its first
/// image; 2 MiB is far above what cameras and editors write and bounds what a client can make
/// the gateway buffer before the size is known.
pub const MAX_PROBE_BYTES: usize = 2 << 20;

/// The formats SGLang's image loader accepts (`image_extension_names` in
/// `python/sglang/srt/utils/common.py`, SGLang 0.5.23).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    /// PNG (also APNG: the size is IHDR's).
    Png,
    /// JPEG: baseline, extended, progressive or lossless frames.
    Jpeg,
    /// WebP: lossy (VP8), lossless (VP8L) or extended (VP8X, animations included).
    WebP,
    /// GIF 87a / 89a.
    Gif,
}

impl ImageFormat {
    /// The format's name as Pillow reports it (`Image.format`).
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::WebP => "WEBP",
            ImageFormat::Gif => "GIF",
        }
    }
}

impl std::fmt::Display for ImageFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An image's format and size as Pillow reports them (`Image.format`, `Image.size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// The file format.
    pub format: ImageFormat,
    /// Width in pixels (never zero).
    pub width: u32,
    /// Height in pixels (never zero).
    pub height: u32,
}

/// The answer of [`probe`] for one prefix of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The size is known; no more bytes are needed.
    Known(ImageInfo),
    /// The prefix ends before the size: call again with at least `at_least` bytes (never more
    /// than [`MAX_PROBE_BYTES`]; past that the answer is [`ImageError::HeaderTooLong`]).
    NeedMore {
        /// The prefix length the next step needs.
        at_least: usize,
    },
    /// The file is not an image the engine would open.
    Invalid(ImageError),
}

/// Reads an image's format and size from a prefix of its file.
///
/// It looks only at headers (never at pixel data), allocates nothing, and gives the same answer
/// for every prefix long enough to hold the size. A file whose declared size is over
/// [`MAX_IMAGE_PIXELS`] is [`ImageError::TooLarge`] as soon as the size is read.
pub fn probe(prefix: &[u8]) -> Probe {
    let step = match sniff(prefix) {
        Sniff::Format(ImageFormat::Png) => png::probe(prefix),
        Sniff::Format(ImageFormat::Jpeg) => jpeg::probe(prefix),
        Sniff::Format(ImageFormat::WebP) => webp::probe(prefix),
        Sniff::Format(ImageFormat::Gif) => gif::probe(prefix),
        Sniff::NeedMore(at_least) => return Probe::NeedMore { at_least },
        Sniff::Unknown => return Probe::Invalid(ImageError::UnknownFormat),
    };
    match step {
        Probe::Known(info) => checked(info),
        Probe::NeedMore { at_least } if at_least > MAX_PROBE_BYTES => {
            let format = match sniff(prefix) {
                Sniff::Format(format) => format,
                // Unreachable: the format was sniffed above from the same prefix.
                _ => return Probe::Invalid(ImageError::UnknownFormat),
            };
            Probe::Invalid(ImageError::HeaderTooLong {
                format,
                limit: MAX_PROBE_BYTES,
            })
        }
        other => other,
    }
}

/// [`probe`] on a whole file: a file that ends before its size is [`ImageError::Truncated`].
pub fn probe_file(file: &[u8]) -> Result<ImageInfo, ImageError> {
    match probe(file) {
        Probe::Known(info) => Ok(info),
        Probe::Invalid(error) => Err(error),
        Probe::NeedMore { .. } => Err(match sniff(file) {
            Sniff::Format(format) => ImageError::Truncated { format },
            _ => ImageError::UnknownFormat,
        }),
    }
}

/// The zero-side and decompression-bomb checks every format shares.
fn checked(info: ImageInfo) -> Probe {
    if info.width == 0 || info.height == 0 {
        return Probe::Invalid(ImageError::Corrupt {
            format: info.format,
            reason: "zero width or height",
        });
    }
    let pixels = u64::from(info.width) * u64::from(info.height);
    if pixels > MAX_IMAGE_PIXELS {
        return Probe::Invalid(ImageError::TooLarge {
            width: info.width,
            height: info.height,
            pixels,
            limit: MAX_IMAGE_PIXELS,
        });
    }
    Probe::Known(info)
}

enum Sniff {
    Format(ImageFormat),
    NeedMore(usize),
    Unknown,
}

/// The signatures Pillow's `_accept` functions test.
const SIGNATURES: [(ImageFormat, &[u8]); 4] = [
    (ImageFormat::Png, b"\x89PNG\r\n\x1a\n"),
    (ImageFormat::Jpeg, b"\xff\xd8\xff"),
    (ImageFormat::Gif, b"GIF8"),
    (ImageFormat::WebP, b"RIFF"),
];

fn sniff(prefix: &[u8]) -> Sniff {
    let mut shortest_open: Option<usize> = None;
    for (format, signature) in SIGNATURES {
        let n = signature.len().min(prefix.len());
        if prefix[..n] != signature[..n] {
            continue;
        }
        if prefix.len() < signature.len() {
            let need = signature.len();
            shortest_open = Some(shortest_open.map_or(need, |s| s.min(need)));
            continue;
        }
        // RIFF is WebP only with "WEBP" at 8..12; GIF only as 87a / 89a.
        return match format {
            ImageFormat::WebP if prefix.len() < 12 => Sniff::NeedMore(12),
            ImageFormat::WebP if &prefix[8..12] != b"WEBP" => Sniff::Unknown,
            ImageFormat::Gif if prefix.len() < 6 => Sniff::NeedMore(6),
            ImageFormat::Gif if &prefix[4..6] != b"7a" && &prefix[4..6] != b"9a" => Sniff::Unknown,
            _ => Sniff::Format(format),
        };
    }
    match shortest_open {
        Some(need) => Sniff::NeedMore(need),
        None if prefix.is_empty() => Sniff::NeedMore(1),
        None => Sniff::Unknown,
    }
}

/// Big-endian u16 at `at` (the caller has checked the length).
fn be16(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

/// Little-endian u16 at `at` (the caller has checked the length).
fn le16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

#[cfg(test)]
mod tests;
