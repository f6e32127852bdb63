//! JPEG: walk the marker segments to the start of scan; the size is the last frame header's.
//!
//! Pillow's walk (`PIL/JpegImagePlugin.py` `JpegImageFile._open`, Pillow 13.0.0): after SOI it
//! skips bytes that are not 0xFF, treats 0xFF 0x00 / 0xFF 0xFF as padding, reads every marker
//! 0xFFC0..=0xFFFE (JPG, RSTn, SOI, EOI and JPGn without a segment; the others' segments are
//! skipped by their length, and SOFn and DHP set the size) and stops at
//! SOS; any other marker is "no marker found". Each SOFn replaces the size, so a file with two
//! frame headers is sized by the one nearest SOS, and the probe reads on to SOS too. `SOF`
//! refuses a sample precision other than 8 ("cannot handle 12-bit layers") and a component
//! count other than 1, 3 or 4.

use super::{be16, ImageFormat, ImageInfo, Probe};
use crate::vision::error::ImageError;

/// Start of scan: the entropy-coded data follows, the header is over.
const SOS: u8 = 0xDA;

pub(super) fn probe(prefix: &[u8]) -> Probe {
    // After SOI (FF D8); `sniff` has checked the third byte is FF.
    let mut at = 2;
    let mut size: Option<(u32, u32)> = None;
    loop {
        let Some(&byte) = prefix.get(at) else {
            return Probe::NeedMore { at_least: at + 1 };
        };
        if byte != 0xFF {
            // Junk between segments: Pillow skips it a byte at a time.
            at += 1;
            continue;
        }
        let Some(&marker) = prefix.get(at + 1) else {
            return Probe::NeedMore { at_least: at + 2 };
        };
        match marker {
            // Fill byte (FF FF) or stuffed zero (FF 00): Pillow moves on.
            0xFF => at += 1,
            0x00 => at += 2,
            SOS => {
                return match size {
                    Some((width, height)) => Probe::Known(ImageInfo {
                        format: ImageFormat::Jpeg,
                        width,
                        height,
                    }),
                    None => corrupt("start of scan before any frame header"),
                };
            }
            // Markers Pillow reads no segment for: JPG, RST0-7, SOI, EOI, JPG0-13.
            0xC8 | 0xD0..=0xD9 | 0xF0..=0xFD => at += 2,
            0xC0..=0xFE => {
                let Some(length) = prefix.get(at + 2..at + 4) else {
                    return Probe::NeedMore { at_least: at + 4 };
                };
                let length = usize::from(be16(length, 0));
                if length < 2 {
                    return corrupt("segment length under 2");
                }
                let end = at + 2 + length;
                if is_frame_header(marker) {
                    let Some(segment) = prefix.get(at + 4..end) else {
                        return Probe::NeedMore { at_least: end };
                    };
                    match frame_size(segment) {
                        Ok(found) => size = Some(found),
                        Err(error) => return Probe::Invalid(error),
                    }
                }
                // Other segments (APPn with EXIF/ICC/XMP, DQT, DHT, COM, …) are skipped unread.
                at = end;
            }
            _ => return corrupt("no marker found"),
        }
    }
}

/// SOF0-3, 5-7, 9-11, 13-15, and DHP, which Pillow's table also hands to its `SOF` handler.
/// C4 (DHT), C8 (JPG) and CC (DAC) are not frames.
fn is_frame_header(marker: u8) -> bool {
    (matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC)) || marker == 0xDE
}

/// `(width, height)` of a frame header's payload: precision, height, width, components.
fn frame_size(segment: &[u8]) -> Result<(u32, u32), ImageError> {
    if segment.len() < 6 {
        return Err(ImageError::Corrupt {
            format: ImageFormat::Jpeg,
            reason: "frame header shorter than 6 bytes",
        });
    }
    if segment[0] != 8 {
        return Err(ImageError::Unsupported {
            format: ImageFormat::Jpeg,
            reason: "sample precision other than 8 bits",
        });
    }
    if !matches!(segment[5], 1 | 3 | 4) {
        return Err(ImageError::Unsupported {
            format: ImageFormat::Jpeg,
            reason: "component count other than 1, 3 or 4",
        });
    }
    Ok((u32::from(be16(segment, 3)), u32::from(be16(segment, 1))))
}

fn corrupt(reason: &'static str) -> Probe {
    Probe::Invalid(ImageError::Corrupt {
        format: ImageFormat::Jpeg,
        reason,
    })
}
