use super::*;
use base64::engine::general_purpose::STANDARD;

fn url_of(bytes: &[u8]) -> String {
    format!("data:image/png;base64,{}", STANDARD.encode(bytes))
}

fn image(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

#[test]
fn decodes_the_whole_image_when_asked() {
    let img = image(1000);
    let url = url_of(&img);
    let data = DataUrl::parse(&url, &DataUrlLimits::default()).unwrap();
    assert_eq!(data.media_type(), "image/png");
    assert_eq!(data.decoded_len(), 1000);
    assert_eq!(data.decode_prefix(usize::MAX), img);
    for len in [0, 1, 2, 3, 4, 5, 299, 300, 301, 999, 1000] {
        assert_eq!(data.decode_prefix(len), img[..len], "prefix {len}");
    }
}

#[test]
fn decoded_len_is_exact_for_every_padding() {
    for len in 0..20 {
        let img = image(len);
        let padded = url_of(&img);
        let unpadded = padded.trim_end_matches('=').to_string();
        for url in [&padded, &unpadded] {
            let data = DataUrl::parse(url, &DataUrlLimits::default()).unwrap();
            assert_eq!(data.decoded_len(), len, "{url}");
            assert_eq!(data.decode_prefix(usize::MAX), img, "{url}");
        }
    }
}

#[test]
fn reads_only_the_prefix_the_caller_needs() {
    let img = image(1 << 20);
    let url = url_of(&img);
    let data = DataUrl::parse(&url, &DataUrlLimits::default()).unwrap();
    let mut seen = Vec::new();
    let prefix = data
        .read(|bytes| {
            seen.push(bytes.len());
            if bytes.len() >= 5000 {
                Enough::Yes
            } else {
                Enough::NeedMore { at_least: 5000 }
            }
        })
        .unwrap();
    assert!(!prefix.complete);
    assert_eq!(prefix.bytes, img[..prefix.bytes.len()]);
    assert!(
        prefix.bytes.len() >= 5000 && prefix.bytes.len() < 5003,
        "{seen:?}"
    );
    // Whole 3-byte groups are decoded: 1024 asked, 1026 seen.
    assert_eq!(seen, [FIRST_READ.div_ceil(3) * 3, prefix.bytes.len()]);
}

#[test]
fn read_to_the_end_is_complete() {
    let img = image(3000);
    let url = url_of(&img);
    let data = DataUrl::parse(&url, &DataUrlLimits::default()).unwrap();
    let prefix = data.read(|_| Enough::NeedMore { at_least: 1 }).unwrap();
    assert!(prefix.complete);
    assert_eq!(prefix.bytes, img);
}

#[test]
fn a_stop_is_the_callers_reason() {
    let url = url_of(&image(10));
    let data = DataUrl::parse(&url, &DataUrlLimits::default()).unwrap();
    let err = data
        .read(|_| Enough::Stop("image is 100000x100000".into()))
        .unwrap_err();
    assert_eq!(err.code(), "refused");
    assert_eq!(err.to_string(), "image is 100000x100000");
}

#[test]
fn too_long_is_refused_before_anything_else() {
    let limits = DataUrlLimits { max_encoded_len: 8 };
    // Not base64 either: the cap is checked first.
    let err = DataUrl::parse("data:image/png;base64,!!!!!!!!!!!!", &limits).unwrap_err();
    assert_eq!(err, DataUrlError::TooLong { len: 12, max: 8 });
    assert!(err.to_string().contains("at most 8"), "{err}");
    assert!(DataUrl::parse("data:image/png;base64,AAAAAAAA", &limits).is_ok());
}

#[test]
fn not_base64_says_so() {
    let err = DataUrl::parse("data:image/svg+xml,<svg/>", &DataUrlLimits::default()).unwrap_err();
    assert_eq!(err.code(), "not_base64");
    assert!(err.to_string().contains("must be base64"), "{err}");
    assert!(
        err.to_string().contains("data:image/svg+xml;base64,"),
        "{err}"
    );
    // `base64` must be the last parameter, as RFC 2397 writes it.
    let err =
        DataUrl::parse("data:image/png;base64;x=y,AAAA", &DataUrlLimits::default()).unwrap_err();
    assert_eq!(err.code(), "not_base64");
}

#[test]
fn not_an_image_says_which_type() {
    for (url, shown) in [
        ("data:text/html;base64,PGI+", "text/html"),
        ("data:;base64,AAAA", "text/plain"),
        ("data:,hello", "text/plain"),
        ("data:image/;base64,AAAA", "image/"),
    ] {
        let err = DataUrl::parse(url, &DataUrlLimits::default()).unwrap_err();
        assert_eq!(
            err,
            DataUrlError::NotImage {
                media_type: shown.into()
            },
            "{url}"
        );
    }
}

#[test]
fn accepts_parameters_and_any_case() {
    let data = DataUrl::parse(
        "DATA:Image/JPEG;name=a.jpg;BASE64,AAAA",
        &DataUrlLimits::default(),
    )
    .unwrap();
    assert_eq!(data.media_type(), "Image/JPEG");
    assert_eq!(data.decode_prefix(10), [0, 0, 0]);
}

#[test]
fn bad_base64_names_the_place() {
    for (data, at, what) in [
        ("AAAA!AAA", 4, "outside"),
        ("AAAA AAA", 4, "whitespace"),
        ("AA-_", 2, "URL-safe"),
        ("AA%2B", 2, "percent"),
        ("AA=A", 2, "padding before"),
        ("AAAAA", 4, "length"),
        ("AAA=A===", 3, "padding before"),
        ("AA=", 2, "padding that"),
    ] {
        let url = format!("data:image/png;base64,{data}");
        let err = DataUrl::parse(&url, &DataUrlLimits::default()).unwrap_err();
        let DataUrlError::BadBase64 { at: got, reason } = &err else {
            panic!("{data}: {err:?}");
        };
        assert_eq!(*got, at, "{data}: {err}");
        assert!(reason.contains(what), "{data}: {err}");
        assert_eq!(err.code(), "bad_base64");
    }
}

#[test]
fn malformed_and_other_schemes() {
    assert_eq!(
        DataUrl::parse("data:image/png;base64", &DataUrlLimits::default()),
        Err(DataUrlError::Malformed)
    );
    assert_eq!(
        DataUrl::parse("https://example.com/a.png", &DataUrlLimits::default()),
        Err(DataUrlError::NotDataUrl)
    );
    // A header longer than any media type is malformed, whatever follows.
    let url = format!("data:image/png;{};base64,AAAA", "x".repeat(300));
    assert_eq!(
        DataUrl::parse(&url, &DataUrlLimits::default()),
        Err(DataUrlError::Malformed)
    );
    assert!(DataUrl::is_data_url("Data:image/png;base64,"));
    assert!(!DataUrl::is_data_url("dat"));
}

#[test]
fn empty_image_is_empty() {
    let data = DataUrl::parse("data:image/png;base64,", &DataUrlLimits::default()).unwrap();
    assert_eq!(data.decoded_len(), 0);
    let prefix = data.read(|_| Enough::NeedMore { at_least: 8 }).unwrap();
    assert!(prefix.complete && prefix.bytes.is_empty());
}
