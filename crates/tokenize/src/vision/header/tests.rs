//! Probe unit tests: truncated headers, corrupt data, bombs, and the format rules.

use super::*;

fn png(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(13u32.to_be_bytes());
    out.extend(&ihdr);
    out.extend(png::crc32_for_tests(&ihdr).to_be_bytes());
    out
}

fn jpeg(segments: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = vec![0xFF, 0xD8];
    for (marker, payload) in segments {
        out.extend([0xFF, *marker]);
        out.extend(
            u16::try_from(payload.len() + 2)
                .expect("short")
                .to_be_bytes(),
        );
        out.extend(*payload);
    }
    out
}

fn sof(width: u16, height: u16) -> Vec<u8> {
    let mut s = vec![8];
    s.extend(height.to_be_bytes());
    s.extend(width.to_be_bytes());
    s.extend([3, 1, 0x22, 0, 2, 0x11, 1, 3, 0x11, 1]);
    s
}

fn known(format: ImageFormat, width: u32, height: u32) -> Probe {
    Probe::Known(ImageInfo {
        format,
        width,
        height,
    })
}

#[test]
fn empty_and_short_prefixes_ask_for_more() {
    assert_eq!(probe(b""), Probe::NeedMore { at_least: 3 });
    assert_eq!(probe(b"\x89P"), Probe::NeedMore { at_least: 8 });
    assert_eq!(probe(b"GIF"), Probe::NeedMore { at_least: 4 });
    assert_eq!(probe(b"GIF8"), Probe::NeedMore { at_least: 6 });
    assert_eq!(probe(b"RIFF\0\0\0\0WE"), Probe::NeedMore { at_least: 12 });
    assert_eq!(probe(b"\xff\xd8"), Probe::NeedMore { at_least: 3 });
}

#[test]
fn unknown_signatures_are_invalid() {
    for bytes in [
        &b"BM\0\0"[..],
        b"\0\0\0\x0cjP  ",
        b"RIFF\0\0\0\0WAVE",
        b"GIF8xa",
        b"<svg",
    ] {
        assert_eq!(
            probe(bytes),
            Probe::Invalid(ImageError::UnknownFormat),
            "{bytes:?}"
        );
    }
}

#[test]
fn png_reads_ihdr_and_checks_it() {
    let file = png(640, 480);
    assert_eq!(probe(&file), known(ImageFormat::Png, 640, 480));
    for len in 0..file.len() {
        assert!(
            matches!(probe(&file[..len]), Probe::NeedMore { .. }),
            "{len}"
        );
    }
    let mut bad_crc = file.clone();
    bad_crc[20] ^= 1;
    assert!(matches!(
        probe(&bad_crc),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
    let mut not_ihdr = file.clone();
    not_ihdr[12..16].copy_from_slice(b"IDAT");
    assert!(matches!(
        probe(&not_ihdr),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
    assert!(matches!(
        probe(&png(0, 5)),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
}

#[test]
fn png_with_a_huge_declared_ihdr_stops_at_the_cap() {
    let mut file = png(1, 1);
    file[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        probe(&file),
        Probe::Invalid(ImageError::HeaderTooLong {
            format: ImageFormat::Png,
            limit: MAX_PROBE_BYTES
        })
    );
}

#[test]
fn bombs_are_refused_from_the_header() {
    assert_eq!(
        probe(&png(13_378, 13_378)),
        Probe::Invalid(ImageError::TooLarge {
            width: 13_378,
            height: 13_378,
            pixels: 178_970_884,
            limit: MAX_IMAGE_PIXELS
        })
    );
    assert_eq!(
        probe(&png(13_377, 13_377)),
        known(ImageFormat::Png, 13_377, 13_377)
    );
    assert!(matches!(
        probe(&png(u32::MAX, u32::MAX)),
        Probe::Invalid(ImageError::TooLarge { .. })
    ));
    // A GIF screen is refused before its blocks are read.
    let gif = b"GIF89a\xff\xff\xff\xff\0\0\0";
    assert!(matches!(
        probe(gif),
        Probe::Invalid(ImageError::TooLarge { .. })
    ));
}

#[test]
fn jpeg_skips_segments_and_takes_the_last_frame_header() {
    let exif = vec![0u8; 5000];
    let file = jpeg(&[
        (0xE0, b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"),
        (0xE1, &exif),
        (0xDB, &[0; 65]),
        (0xC2, &sof(300, 200)),
        (0xC4, &[0; 20]),
        (0xDA, &[1, 1, 0, 0, 63, 0]),
    ]);
    assert_eq!(probe(&file), known(ImageFormat::Jpeg, 300, 200));
    // Before SOS the answer waits: a later SOF would replace the size.
    let sos = file.len() - 10;
    assert!(matches!(probe(&file[..sos]), Probe::NeedMore { .. }));
    let two = jpeg(&[(0xC0, &sof(10, 10)), (0xC1, &sof(20, 30)), (0xDA, &[0; 6])]);
    assert_eq!(probe(&two), known(ImageFormat::Jpeg, 20, 30));
}

#[test]
fn jpeg_fill_bytes_and_junk_are_skipped() {
    // Fill bytes before the frame header, junk between segments: Pillow walks over both.
    let mut file = vec![0xFF, 0xD8, 0xFF, 0xFF];
    file.extend(&jpeg(&[(0xC0, &sof(7, 9))])[2..]);
    file.extend([0x12, 0x34]);
    file.extend(&jpeg(&[(0xDA, &[0; 6])])[2..]);
    assert_eq!(probe(&file), known(ImageFormat::Jpeg, 7, 9));
    // A marker below 0xC0 (other than the FF 00 / FF FF padding) is "no marker found".
    let bad = [0xFF, 0xD8, 0xFF, 0xFF, 0xFF, 0x12, 0x34];
    assert!(matches!(
        probe(&bad),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
}

#[test]
fn jpeg_errors() {
    let no_frame = jpeg(&[(0xE0, b"JFIF\0"), (0xDA, &[0; 6])]);
    assert!(matches!(
        probe(&no_frame),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
    let mut twelve_bit = sof(8, 8);
    twelve_bit[0] = 12;
    let file = jpeg(&[(0xC0, &twelve_bit), (0xDA, &[0; 6])]);
    assert!(matches!(
        probe(&file),
        Probe::Invalid(ImageError::Unsupported { .. })
    ));
    let bad_marker = [0xFF, 0xD8, 0xFF, 0x01, 0, 0];
    assert!(matches!(
        probe(&bad_marker),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
    let short_length = [0xFF, 0xD8, 0xFF, 0xE0, 0, 1];
    assert!(matches!(
        probe(&short_length),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
    let zero_height = jpeg(&[(0xC0, &sof(8, 0)), (0xDA, &[0; 6])]);
    assert!(matches!(
        probe(&zero_height),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
}

#[test]
fn jpeg_metadata_past_the_cap_is_refused_not_buffered() {
    // 40 maximal APP2 segments (ICC chunks) = 2.6 MB before any frame header.
    let big = vec![0u8; 65_533];
    let segments: Vec<(u8, &[u8])> = (0..40).map(|_| (0xE2, &big[..])).collect();
    let file = jpeg(&segments);
    assert_eq!(
        probe(&file),
        Probe::Invalid(ImageError::HeaderTooLong {
            format: ImageFormat::Jpeg,
            limit: MAX_PROBE_BYTES
        })
    );
    // Every prefix asks for at most the cap.
    for len in (0..file.len()).step_by(4093) {
        if let Probe::NeedMore { at_least } = probe(&file[..len]) {
            assert!(at_least <= MAX_PROBE_BYTES);
        }
    }
}

#[test]
fn webp_chunks() {
    let mut vp8 = b"RIFF\0\0\0\0WEBPVP8 \0\0\0\0".to_vec();
    vp8.extend([0x50, 0x2A, 0x00, 0x9D, 0x01, 0x2A]);
    vp8.extend((0xC000u16 | 640).to_le_bytes()); // scale bits set: not part of the size
    vp8.extend(480u16.to_le_bytes());
    assert_eq!(probe(&vp8), known(ImageFormat::WebP, 640, 480));
    assert_eq!(probe(&vp8[..29]), Probe::NeedMore { at_least: 30 });
    let mut no_start = vp8.clone();
    no_start[24] = 0;
    assert!(matches!(
        probe(&no_start),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));

    let bits: u32 = (300 - 1) | ((7 - 1) << 14);
    let mut vp8l = b"RIFF\0\0\0\0WEBPVP8L\0\0\0\0\x2f".to_vec();
    vp8l.extend(bits.to_le_bytes());
    assert_eq!(probe(&vp8l), known(ImageFormat::WebP, 300, 7));
    let mut versioned = vp8l.clone();
    versioned[24] |= 0x20;
    assert!(matches!(
        probe(&versioned),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));

    let mut vp8x = b"RIFF\0\0\0\0WEBPVP8X\x0a\0\0\0\x10\0\0\0".to_vec();
    vp8x.extend([0xFF, 0x3F, 0x00, 0x01, 0x00, 0x00]);
    assert_eq!(probe(&vp8x), known(ImageFormat::WebP, 16384, 2));

    let unknown = b"RIFF\0\0\0\0WEBPALPH\0\0\0\0";
    assert_eq!(probe(unknown), Probe::Invalid(ImageError::UnknownFormat));
}

#[test]
fn gif_screen_and_first_frame() {
    let mut gif = b"GIF89a".to_vec();
    gif.extend([10, 0, 10, 0, 0x80, 0, 0]); // 10x10, a 2-entry global colour table
    gif.extend([0; 6]);
    gif.extend(b"!\xf9\x04\x00\x00\x00\x00\x00"); // graphic control extension
    gif.extend(b"!\xfe\x03abc\x02de\x00"); // a comment in two sub-blocks
    gif.push(0x42); // a stray byte: Pillow skips it
    gif.extend(b",\x05\x00\x05\x00\x14\x00\x1e\x00\x00");
    assert_eq!(probe(&gif), known(ImageFormat::Gif, 25, 35));
    let descriptor = gif.len() - 10;
    assert!(matches!(
        probe(&gif[..descriptor + 9]),
        Probe::NeedMore { .. }
    ));

    let mut inside = gif.clone();
    inside[descriptor + 5] = 2; // a 2x30 frame at x = 5 fits the width
    assert_eq!(probe(&inside), known(ImageFormat::Gif, 10, 35));

    let mut no_image = gif[..descriptor].to_vec();
    no_image.push(b';');
    assert!(matches!(
        probe(&no_image),
        Probe::Invalid(ImageError::Corrupt { .. })
    ));
}

#[test]
fn a_truncated_whole_file_is_truncated() {
    let file = png(4, 4);
    assert_eq!(
        probe_file(&file[..20]),
        Err(ImageError::Truncated {
            format: ImageFormat::Png
        })
    );
    assert_eq!(probe_file(b"hello"), Err(ImageError::UnknownFormat));
}

#[test]
fn corrupt_bytes_never_panic() {
    // A cheap fuzz: every signature followed by every pattern of a small pseudo-random tail.
    let mut state = 0x2545_f491_u32;
    for signature in [
        &b"\x89PNG\r\n\x1a\n"[..],
        b"\xff\xd8\xff",
        b"GIF89a",
        b"RIFF\0\0\0\0WEBP",
    ] {
        for _ in 0..2000 {
            let mut file = signature.to_vec();
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                file.push(state as u8);
            }
            let _ = probe(&file);
            let _ = probe_file(&file);
        }
    }
}
