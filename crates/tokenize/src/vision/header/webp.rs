//! WebP: the size is in the first chunk after `RIFF....WEBP`.
//!
//! Pillow (`PIL/WebPImagePlugin.py` `_accept` and `_get_size`, Pillow 13.0.0) accepts a file
//! whose first chunk is `VP8 `, `VP8L` or `VP8X`, and reads the canvas size from it before
//! libwebp's `WebPAnimDecoder` (whose `get_info` size is the same for a valid file):
//! - `VP8 ` (lossy): after the start code 9D 01 2A at 23, 14-bit little-endian width at 26 and
//!   height at 28 (the top two bits are the upscaling hint, not size);
//! - `VP8L` (lossless): signature 0x2F at 20, then 14 bits of width - 1 and 14 of height - 1;
//!   libwebp (`src/dec/vp8l_dec.c` `ReadImageInfo`, libwebp 1.6.0 as bundled in Pillow 13.0.0's wheel) also requires the 3-bit
//!   version after them to be 0;
//! - `VP8X` (extended: alpha, animation, metadata): 24-bit little-endian canvas width - 1 at
//!   24 and height - 1 at 27.

use super::{le16, ImageFormat, ImageInfo, Probe};
use crate::vision::error::ImageError;

pub(super) fn probe(prefix: &[u8]) -> Probe {
    let Some(chunk) = prefix.get(12..16) else {
        return Probe::NeedMore { at_least: 16 };
    };
    let (width, height) = match chunk {
        b"VP8 " => {
            let Some(s) = prefix.get(..30) else {
                return Probe::NeedMore { at_least: 30 };
            };
            if s[23..26] != [0x9D, 0x01, 0x2A] {
                return corrupt("VP8 start code missing");
            }
            if s[20] & 1 != 0 {
                return corrupt("VP8 bitstream does not start with a key frame");
            }
            (
                u32::from(le16(s, 26) & 0x3FFF),
                u32::from(le16(s, 28) & 0x3FFF),
            )
        }
        b"VP8L" => {
            let Some(s) = prefix.get(..25) else {
                return Probe::NeedMore { at_least: 25 };
            };
            if s[20] != 0x2F {
                return corrupt("VP8L signature missing");
            }
            let bits = u32::from_le_bytes([s[21], s[22], s[23], s[24]]);
            if bits >> 29 != 0 {
                return corrupt("VP8L version is not 0");
            }
            ((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
        }
        b"VP8X" => {
            let Some(s) = prefix.get(..30) else {
                return Probe::NeedMore { at_least: 30 };
            };
            (
                u32::from_le_bytes([s[24], s[25], s[26], 0]) + 1,
                u32::from_le_bytes([s[27], s[28], s[29], 0]) + 1,
            )
        }
        // Pillow's `_accept` fails: "cannot identify image file".
        _ => return Probe::Invalid(ImageError::UnknownFormat),
    };
    Probe::Known(ImageInfo {
        format: ImageFormat::WebP,
        width,
        height,
    })
}

fn corrupt(reason: &'static str) -> Probe {
    Probe::Invalid(ImageError::Corrupt {
        format: ImageFormat::WebP,
        reason,
    })
}
