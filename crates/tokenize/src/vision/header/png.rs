//! PNG: the size is in IHDR, the chunk that must come first.
//!
//! Pillow (`PIL/PngImagePlugin.py` `PngImageFile._open` and `PngStream.chunk_IHDR`, Pillow
//! 13.0.0) reads the chunk's declared length, refuses an IHDR shorter than 13 bytes or with a
//! non-zero filter method, and checks its CRC; width and height are big-endian u32 at 0 and 4.

use super::{ImageFormat, ImageInfo, Probe};
use crate::vision::error::ImageError;

const SIGNATURE_LEN: usize = 8;

pub(super) fn probe(prefix: &[u8]) -> Probe {
    let chunk = SIGNATURE_LEN;
    let Some(head) = prefix.get(chunk..chunk + 8) else {
        return Probe::NeedMore {
            at_least: chunk + 8,
        };
    };
    let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if &head[4..8] != b"IHDR" {
        return corrupt("the first chunk is not IHDR");
    }
    if length < 13 {
        return corrupt("IHDR chunk shorter than 13 bytes");
    }
    // Data, then the CRC over type and data.
    let end = (chunk + 8).saturating_add(length).saturating_add(4);
    let Some(whole) = prefix.get(chunk + 4..end) else {
        return Probe::NeedMore { at_least: end };
    };
    let (typed, crc) = whole.split_at(whole.len() - 4);
    if crc32(typed) != u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return corrupt("bad IHDR checksum");
    }
    let data = &typed[4..];
    if data[11] != 0 {
        return corrupt("unknown filter category");
    }
    Probe::Known(ImageInfo {
        format: ImageFormat::Png,
        width: u32::from_be_bytes([data[0], data[1], data[2], data[3]]),
        height: u32::from_be_bytes([data[4], data[5], data[6], data[7]]),
    })
}

fn corrupt(reason: &'static str) -> Probe {
    Probe::Invalid(ImageError::Corrupt {
        format: ImageFormat::Png,
        reason,
    })
}

/// CRC-32 (ISO-HDLC, as zlib's `crc32`) of a few bytes, bit by bit: IHDR is 17 bytes, so a
/// table would cost more than it saves.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
pub(super) fn crc32_for_tests(bytes: &[u8]) -> u32 {
    crc32(bytes)
}
