use super::target::{Target, TargetHost};
use super::*;
use std::net::IpAddr;

fn https_only() -> FetchPolicy {
    FetchPolicy::allowing()
}

fn with_http() -> FetchPolicy {
    FetchPolicy {
        allow_http: true,
        ..FetchPolicy::allowing()
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn every_spelling_of_an_ipv4_address_is_that_address() {
    for (url, want) in [
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
        ("http://0x7f000001/", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1"),
        ("http://017700000001/", "127.0.0.1"),
        ("http://127.1/", "127.0.0.1"),
        ("http://169.254.43518/", "169.254.169.254"),
        ("http://0xa9fea9fe/", "169.254.169.254"),
        ("http://10.0.0.5./", "10.0.0.5"),
        ("http://%31%30.0.0.5/", "10.0.0.5"),
        ("http://[::ffff:7f00:1]/", "::ffff:127.0.0.1"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
    ] {
        let target = Target::parse(url, &with_http()).unwrap();
        assert_eq!(target.host, TargetHost::Ip(ip(want)), "{url}");
    }
}

#[test]
fn hosts_that_end_in_a_number_but_are_none_are_refused() {
    for url in [
        "http://1.2.3.4.5/",
        "http://0x7g.1/",
        "http://256.0.0.1/",
        "http://example.123/",
    ] {
        let err = Target::parse(url, &with_http()).unwrap_err();
        assert_eq!(err.code(), "invalid_url", "{url}: {err}");
    }
}

#[test]
fn names_stay_names() {
    let target = Target::parse(
        "https://Images.Example.com:8443/a/b.png?x=1#frag",
        &https_only(),
    )
    .unwrap();
    assert_eq!(target.host, TargetHost::Name("images.example.com".into()));
    assert_eq!(target.port, 8443);
    assert!(target.https);
    assert_eq!(target.authority(), "images.example.com:8443");
    assert_eq!(target.path_and_query(), "/a/b.png?x=1");
    let target = Target::parse("https://example.com", &https_only()).unwrap();
    assert_eq!(
        (target.port, target.authority()),
        (443, "example.com".to_string())
    );
    assert_eq!(target.path_and_query(), "/");
}

#[test]
fn schemes_follow_the_policy() {
    let err = Target::parse("http://example.com/a.png", &https_only()).unwrap_err();
    assert_eq!(err.code(), "scheme");
    assert!(err.to_string().contains("over https only"), "{err}");
    assert!(Target::parse("http://example.com/a.png", &with_http()).is_ok());
    for url in [
        "ftp://example.com/a.png",
        "file:///etc/passwd",
        "gopher://x/",
        "data:image/png;base64,AAAA",
    ] {
        let err = Target::parse(url, &with_http()).unwrap_err();
        assert_eq!(err.code(), "scheme", "{url}");
    }
}

#[test]
fn credentials_are_refused() {
    for url in [
        "https://user:pass@example.com/",
        "https://user@example.com/",
        "https://:pw@example.com/",
    ] {
        assert_eq!(
            Target::parse(url, &https_only()),
            Err(FetchError::Credentials),
            "{url}"
        );
    }
}

#[test]
fn redirects_resolve_relative_locations_and_are_checked_again() {
    let first = Target::parse("https://example.com/a/b.png?x", &with_http()).unwrap();
    let next = first.redirect("c.png", &with_http()).unwrap();
    assert_eq!(next.url.as_str(), "https://example.com/a/c.png");
    let next = first
        .redirect("//cdn.example.net/i.png", &with_http())
        .unwrap();
    assert_eq!(next.host, TargetHost::Name("cdn.example.net".into()));
    let next = first.redirect("http://2130706433/", &with_http()).unwrap();
    assert_eq!(next.host, TargetHost::Ip(ip("127.0.0.1")));
    // A downgrade to http is a scheme the https-only policy does not fetch.
    assert_eq!(
        first
            .redirect("http://example.com/", &https_only())
            .unwrap_err()
            .code(),
        "scheme"
    );
    assert_eq!(
        first.redirect("https://u:p@example.com/", &https_only()),
        Err(FetchError::Credentials)
    );
}

#[test]
fn long_urls_are_refused_unread() {
    let url = format!("https://example.com/{}", "a".repeat(9000));
    assert_eq!(
        Target::parse(&url, &https_only()).unwrap_err().code(),
        "invalid_url"
    );
}

#[test]
fn content_types() {
    let check = |ct: Option<&str>, ce: Option<&str>| {
        let mut headers = http::HeaderMap::new();
        if let Some(ct) = ct {
            headers.insert(CONTENT_TYPE, ct.parse().unwrap());
        }
        if let Some(ce) = ce {
            headers.insert(CONTENT_ENCODING, ce.parse().unwrap());
        }
        check_headers(&headers).map_err(|e| e.code())
    };
    assert_eq!(check(Some("image/png"), None), Ok(()));
    assert_eq!(check(Some("Image/JPEG; q=1"), None), Ok(()));
    assert_eq!(check(Some("application/octet-stream"), None), Ok(()));
    assert_eq!(check(Some("binary/octet-stream"), None), Ok(()));
    assert_eq!(check(None, Some("identity")), Ok(()));
    assert_eq!(
        check(Some("text/html; charset=utf-8"), None),
        Err("content_type")
    );
    assert_eq!(check(Some("image/"), None), Err("content_type"));
    assert_eq!(check(Some("application/json"), None), Err("content_type"));
    assert_eq!(
        check(Some("image/png"), Some("gzip")),
        Err("content_encoding")
    );
}

#[tokio::test]
async fn disabled_fetches_nothing() {
    let fetcher = ImageFetcher::new(FetchPolicy::default()).unwrap();
    let err = fetcher
        .fetch("https://example.com/a.png", |_| Enough::Yes)
        .await
        .unwrap_err();
    assert_eq!(err, FetchError::Disabled);
    assert!(err.to_string().contains("data: URL"), "{err}");
}

/// The gateway awaits fetches inside hyper services, which need `Send` futures.
#[test]
fn fetch_futures_are_send() {
    fn assert_send<T: Send>(_: &T) {}
    let fetcher = ImageFetcher::new(FetchPolicy::default()).unwrap();
    let fetch = fetcher.fetch("https://example.com/", |_| Enough::Yes);
    assert_send(&fetch);
    let limits = crate::DataUrlLimits::default();
    let read = crate::read_image("https://example.com/", &limits, &fetcher, |_| Enough::Yes);
    assert_send(&read);
}
