//! GIF: the logical screen, grown to the first frame's extent when that frame overflows it.
//!
//! Pillow (`PIL/GifImagePlugin.py`, Pillow 13.0.0): `_open` sets the size to the logical screen
//! (little-endian u16 width at 6 and height at 8), skips the global colour table, and
//! `_seek(0)` reads blocks up to the first image descriptor: extensions (`!`, a label, then
//! sub-blocks up to a zero length) are skipped, bytes that start no block are ignored, and a
//! trailer (`;`) first means there is no image. If the first frame's `left + width` or
//! `top + height` is past the screen, `.size` becomes `(max(x1, w), max(y1, h))`. That size,
//! not the bare screen, is what the HF processor sees (SGLang loads only the first frame).

use super::{le16, ImageFormat, ImageInfo, Probe, MAX_IMAGE_PIXELS};
use crate::vision::error::ImageError;

/// Header (6) and logical screen descriptor (7).
const SCREEN_END: usize = 13;

pub(super) fn probe(prefix: &[u8]) -> Probe {
    let Some(screen) = prefix.get(..SCREEN_END) else {
        return Probe::NeedMore {
            at_least: SCREEN_END,
        };
    };
    let screen_width = u32::from(le16(screen, 6));
    let screen_height = u32::from(le16(screen, 8));
    // The size only grows from the screen's, so a screen over the bomb limit is refused now,
    // before reading on (Pillow's own check would raise at `_open` too).
    if u64::from(screen_width) * u64::from(screen_height) > MAX_IMAGE_PIXELS {
        return Probe::Known(ImageInfo {
            format: ImageFormat::Gif,
            width: screen_width,
            height: screen_height,
        });
    }
    let flags = screen[10];
    let mut at = SCREEN_END;
    if flags & 0x80 != 0 {
        at += 3 << ((flags & 7) + 1);
    }
    loop {
        let Some(&introducer) = prefix.get(at) else {
            return Probe::NeedMore { at_least: at + 1 };
        };
        match introducer {
            b'!' => {
                // Label, then data sub-blocks, each led by its length, up to a zero length.
                at += 2;
                loop {
                    let Some(&len) = prefix.get(at) else {
                        return Probe::NeedMore { at_least: at + 1 };
                    };
                    at += 1 + usize::from(len);
                    if len == 0 {
                        break;
                    }
                }
            }
            b',' => {
                let Some(descriptor) = prefix.get(at + 1..at + 10) else {
                    return Probe::NeedMore { at_least: at + 10 };
                };
                let right = u32::from(le16(descriptor, 0)) + u32::from(le16(descriptor, 4));
                let bottom = u32::from(le16(descriptor, 2)) + u32::from(le16(descriptor, 6));
                return Probe::Known(ImageInfo {
                    format: ImageFormat::Gif,
                    width: screen_width.max(right),
                    height: screen_height.max(bottom),
                });
            }
            b';' => {
                return Probe::Invalid(ImageError::Corrupt {
                    format: ImageFormat::Gif,
                    reason: "no image in the file",
                })
            }
            // Pillow ignores a byte that starts no block.
            _ => at += 1,
        }
    }
}
