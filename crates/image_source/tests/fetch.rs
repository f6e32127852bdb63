//! End to end: the fetcher against real servers on loopback, and a scripted resolver for
//! DNS that changes its answers. No test measures wall-clock time: the timeout test runs on
//! tokio's paused clock and asserts only the error.

mod support;

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kvgate_image_source::{Enough, FetchError, FetchPolicy, Forbidden};
use support::{fetcher, loopback_policy, Reply, ScriptedDns, Server, PNG_HEADER};

/// Enough once the PNG header is there.
fn header_only(bytes: &[u8]) -> Enough {
    if bytes.len() >= PNG_HEADER.len() {
        Enough::Yes
    } else {
        Enough::NeedMore {
            at_least: PNG_HEADER.len(),
        }
    }
}

/// Never enough: read until something else stops it.
fn everything(bytes: &[u8]) -> Enough {
    Enough::NeedMore {
        at_least: bytes.len() + 1,
    }
}

fn forbidden(err: &FetchError) -> (IpAddr, Forbidden) {
    match err {
        FetchError::Forbidden { addr, class, .. } => (*addr, *class),
        other => panic!("expected a forbidden address, got {other:?}"),
    }
}

#[tokio::test]
async fn reads_only_the_header_and_drops_the_connection() {
    const TOTAL: usize = 64 << 20;
    let server = Server::start(|_| Reply::png(TOTAL)).await;
    let prefix = fetcher(loopback_policy())
        .fetch(&server.url("/cat.png"), header_only)
        .await
        .unwrap();
    assert!(!prefix.complete);
    assert_eq!(&prefix.bytes[..PNG_HEADER.len()], PNG_HEADER);
    assert!(
        prefix.bytes.len() < 1 << 20,
        "read {} bytes",
        prefix.bytes.len()
    );
    // The server finds the connection closed long before the body ends. (The timeout only
    // keeps a failure from hanging the test.)
    tokio::time::timeout(Duration::from_secs(60), server.stats.ended.notified())
        .await
        .expect("the server's connection ends once the client drops it");
    assert!(server.stats.closed_early.load(Ordering::SeqCst));
    let sent = server.stats.sent.load(Ordering::SeqCst);
    assert!(sent < TOTAL, "the whole body was sent ({sent} bytes)");
    let requests = server.stats.requests();
    assert_eq!(requests.len(), 1);
    let head = requests[0].to_ascii_lowercase();
    assert!(head.starts_with("get /cat.png http/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("host: {}\r\n", server.addr)),
        "{head}"
    );
    assert!(head.contains("accept-encoding: identity\r\n"), "{head}");
}

#[tokio::test]
async fn a_small_image_is_read_whole() {
    let server = Server::start(|_| Reply::png(100)).await;
    let prefix = fetcher(loopback_policy())
        .fetch(&server.url("/small.png"), |_| Enough::NeedMore {
            at_least: 1000,
        })
        .await
        .unwrap();
    assert!(prefix.complete);
    assert_eq!(prefix.bytes.len(), 100);
}

#[tokio::test]
async fn loopback_is_refused_without_an_allow_list() {
    let server = Server::start(|_| Reply::png(100)).await;
    let policy = FetchPolicy {
        allow_http: true,
        ..FetchPolicy::allowing()
    };
    let err = fetcher(policy)
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(
        forbidden(&err),
        ("127.0.0.1".parse().unwrap(), Forbidden::Loopback)
    );
    assert_eq!(err.code(), "forbidden_address");
    assert_eq!(server.stats.connections(), 0);
}

#[tokio::test]
async fn forbidden_literals_are_refused_before_connecting() {
    let server = Server::start(|_| Reply::png(100)).await;
    let port = server.addr.port();
    // The allow-list holds 127.0.0.1 exactly: every other spelling and neighbour is refused.
    for (url, addr, class) in [
        (
            format!("http://127.0.0.2:{port}/"),
            "127.0.0.2",
            Forbidden::Loopback,
        ),
        (format!("http://[::1]:{port}/"), "::1", Forbidden::Loopback),
        (
            format!("http://0.0.0.0:{port}/"),
            "0.0.0.0",
            Forbidden::Unspecified,
        ),
        (
            format!("http://2130706434:{port}/"),
            "127.0.0.2",
            Forbidden::Loopback,
        ),
        (
            format!("http://0x7f.2:{port}/"),
            "127.0.0.2",
            Forbidden::Loopback,
        ),
        (
            format!("http://0177.0.0.2:{port}/"),
            "127.0.0.2",
            Forbidden::Loopback,
        ),
        ("http://10.0.0.5/".into(), "10.0.0.5", Forbidden::Private),
        (
            "http://172.16.3.4/".into(),
            "172.16.3.4",
            Forbidden::Private,
        ),
        (
            "http://192.168.1.1/".into(),
            "192.168.1.1",
            Forbidden::Private,
        ),
        (
            "http://100.64.0.1/".into(),
            "100.64.0.1",
            Forbidden::SharedNat,
        ),
        (
            "http://169.254.10.1/".into(),
            "169.254.10.1",
            Forbidden::LinkLocal,
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "169.254.169.254",
            Forbidden::Metadata,
        ),
        (
            "http://0xa9fea9fe/".into(),
            "169.254.169.254",
            Forbidden::Metadata,
        ),
        (
            "http://[fd00:ec2::254]/".into(),
            "fd00:ec2::254",
            Forbidden::Metadata,
        ),
        ("http://[fe80::1]/".into(), "fe80::1", Forbidden::LinkLocal),
        (
            "http://[fc00::1]/".into(),
            "fc00::1",
            Forbidden::UniqueLocal,
        ),
        (
            "http://[::ffff:10.0.0.5]/".into(),
            "::ffff:10.0.0.5",
            Forbidden::Private,
        ),
        (
            "http://[::ffff:169.254.169.254]/".into(),
            "::ffff:169.254.169.254",
            Forbidden::Metadata,
        ),
        (
            "http://[64:ff9b::a00:5]/".into(),
            "64:ff9b::a00:5",
            Forbidden::Private,
        ),
        (
            "http://224.0.0.1/".into(),
            "224.0.0.1",
            Forbidden::Multicast,
        ),
        (
            "http://255.255.255.255/".into(),
            "255.255.255.255",
            Forbidden::Broadcast,
        ),
        (
            "http://192.0.2.1/".into(),
            "192.0.2.1",
            Forbidden::Documentation,
        ),
    ] {
        let err = fetcher(loopback_policy())
            .fetch(&url, header_only)
            .await
            .unwrap_err();
        assert_eq!(forbidden(&err), (addr.parse().unwrap(), class), "{url}");
    }
    // A mapped spelling of the allowed address is that address, so it is allowed.
    let prefix = fetcher(loopback_policy())
        .fetch(&format!("http://[::ffff:127.0.0.1]:{port}/"), header_only)
        .await;
    // Reaching it needs a dual-stack socket; either way it was not refused.
    if let Err(err) = prefix {
        assert_ne!(err.code(), "forbidden_address", "{err}");
    }
    assert!(server.stats.connections() <= 1);
}

#[tokio::test]
async fn the_message_names_the_reason() {
    let err = fetcher(loopback_policy())
        .fetch("http://10.0.0.5/a.png", header_only)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "image URL host `10.0.0.5` resolves to a private address (10.0.0.5): remote images may only come from public addresses"
    );
    assert_eq!(err.status(), 400);
    assert_eq!((err.code(), err.reason()), ("forbidden_address", "private"));
    let err = fetcher(loopback_policy())
        .fetch("http://169.254.169.254/latest/meta-data/", header_only)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "metadata");
    assert!(
        err.to_string()
            .contains("the cloud metadata address (169.254.169.254)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_redirect_to_a_forbidden_address_is_refused() {
    let hidden = Server::start_on("127.0.0.2", |_| Reply::png(100)).await;
    let target = hidden.url("/secret");
    let server = Server::start(move |_| Reply::Redirect(target.clone())).await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(
        forbidden(&err),
        ("127.0.0.2".parse().unwrap(), Forbidden::Loopback)
    );
    assert_eq!(
        hidden.stats.connections(),
        0,
        "the forbidden host was never reached"
    );

    let server =
        Server::start(|_| Reply::Redirect("http://169.254.169.254/latest/meta-data/".into())).await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(forbidden(&err).1, Forbidden::Metadata);

    let server = Server::start(|_| Reply::Redirect("http://2130706434/".into())).await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(
        forbidden(&err),
        ("127.0.0.2".parse().unwrap(), Forbidden::Loopback)
    );
}

#[tokio::test]
async fn relative_redirects_are_followed() {
    let server = Server::start(|path| match path {
        "/old" => Reply::Redirect("new/cat.png?v=2".into()),
        _ => Reply::png(100),
    })
    .await;
    let prefix = fetcher(loopback_policy())
        .fetch(&server.url("/old"), header_only)
        .await
        .unwrap();
    assert_eq!(&prefix.bytes[..PNG_HEADER.len()], PNG_HEADER);
    let requests = server.stats.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        requests[1].starts_with("GET /new/cat.png?v=2 HTTP/1.1"),
        "{}",
        requests[1]
    );
}

#[tokio::test]
async fn too_many_redirects_are_refused() {
    let server = Server::start(|_| Reply::Redirect("/again".into())).await;
    let policy = FetchPolicy {
        max_redirects: 3,
        ..loopback_policy()
    };
    let err = fetcher(policy)
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(err, FetchError::TooManyRedirects { max: 3 });
    assert_eq!(
        server.stats.requests().len(),
        4,
        "the first request and three redirects"
    );

    let policy = FetchPolicy {
        max_redirects: 0,
        ..loopback_policy()
    };
    let err = fetcher(policy)
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "too_many_redirects");
}

#[tokio::test]
async fn a_redirect_without_location_is_refused() {
    let server = Server::start(|_| Reply::Status(302)).await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "redirect");
}

#[tokio::test]
async fn rebinding_dns_cannot_move_the_connection() {
    let server = Server::start(|_| Reply::png(1000)).await;
    let port = server.addr.port();
    // Checked answer first, a forbidden one for anyone who asks again.
    let dns = ScriptedDns::new(&[&["127.0.0.1"], &["10.0.0.5"]]);
    let prefix = fetcher(loopback_policy())
        .with_resolver(dns.clone())
        .fetch(&format!("http://images.test:{port}/cat.png"), header_only)
        .await
        .unwrap();
    assert_eq!(&prefix.bytes[..PNG_HEADER.len()], PNG_HEADER);
    assert_eq!(
        dns.lookups(),
        1,
        "one lookup per hop: the checked answer is the one used"
    );
    assert_eq!(server.stats.connections(), 1);
    let head = server.stats.requests()[0].to_ascii_lowercase();
    assert!(
        head.contains(&format!("host: images.test:{port}\r\n")),
        "{head}"
    );
}

#[tokio::test]
async fn each_redirect_hop_is_looked_up_and_checked_again() {
    let server = Server::start(|path| match path {
        "/a" => Reply::Redirect("/b".into()),
        _ => Reply::png(1000),
    })
    .await;
    let port = server.addr.port();
    let dns = ScriptedDns::new(&[&["127.0.0.1"], &["10.0.0.5"]]);
    let err = fetcher(loopback_policy())
        .with_resolver(dns.clone())
        .fetch(&format!("http://images.test:{port}/a"), header_only)
        .await
        .unwrap_err();
    assert_eq!(
        forbidden(&err),
        ("10.0.0.5".parse().unwrap(), Forbidden::Private)
    );
    assert_eq!(dns.lookups(), 2);
    assert_eq!(
        server.stats.requests().len(),
        1,
        "the second hop never connected"
    );
}

#[tokio::test]
async fn one_forbidden_answer_refuses_the_host() {
    let server = Server::start(|_| Reply::png(1000)).await;
    let port = server.addr.port();
    for answer in [
        &["127.0.0.1", "10.0.0.5"][..],
        &["169.254.169.254", "127.0.0.1"][..],
    ] {
        let dns = ScriptedDns::new(&[answer]);
        let err = fetcher(loopback_policy())
            .with_resolver(dns)
            .fetch(&format!("http://images.test:{port}/"), header_only)
            .await
            .unwrap_err();
        assert_eq!(err.code(), "forbidden_address", "{answer:?}");
    }
    assert_eq!(server.stats.connections(), 0);
}

#[tokio::test]
async fn dns_failures_are_reported() {
    let err = fetcher(loopback_policy())
        .with_resolver(ScriptedDns::failing())
        .fetch("http://images.test/", header_only)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FetchError::Dns { host, .. } if host == "images.test"),
        "{err:?}"
    );
    let err = fetcher(loopback_policy())
        .with_resolver(ScriptedDns::new(&[&[]]))
        .fetch("http://images.test/", header_only)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "dns");
}

#[tokio::test]
async fn the_byte_cap_holds() {
    let server = Server::start(|_| Reply::png(4 << 20)).await;
    let policy = FetchPolicy {
        max_bytes: 64 << 10,
        ..loopback_policy()
    };
    let fetcher = fetcher(policy);
    let mut largest = 0;
    let err = fetcher
        .fetch(&server.url("/"), |bytes: &[u8]| {
            largest = largest.max(bytes.len());
            everything(bytes)
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FetchError::TooLarge {
            max_bytes: 64 << 10
        }
    );
    assert!(largest <= 64 << 10, "the closure saw {largest} bytes");
    // Asking for more than the cap up front ends it at once.
    let err = fetcher
        .fetch(&server.url("/"), |_| Enough::NeedMore { at_least: 1 << 20 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), "too_large");
}

#[tokio::test(start_paused = true)]
async fn a_trickling_server_times_out() {
    let server = Server::start(|_| Reply::Trickle {
        every: Duration::from_secs(1),
    })
    .await;
    let policy = FetchPolicy {
        timeout: Duration::from_secs(5),
        ..loopback_policy()
    };
    let err = fetcher(policy)
        .fetch(&server.url("/"), everything)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FetchError::Timeout {
            after: Duration::from_secs(5)
        }
    );
    assert_eq!(err.code(), "timeout");
}

#[tokio::test]
async fn not_an_image_is_refused() {
    let server = Server::start(|_| Reply::Image {
        content_type: "text/html; charset=utf-8",
        prefix: b"<html>".to_vec(),
        total: 6,
    })
    .await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FetchError::ContentType {
            content_type: "text/html; charset=utf-8".into()
        }
    );
    // Octet-stream is taken: the caller's parser judges the bytes.
    let server = Server::start(|_| Reply::Image {
        content_type: "application/octet-stream",
        prefix: PNG_HEADER.to_vec(),
        total: 100,
    })
    .await;
    assert!(fetcher(loopback_policy())
        .fetch(&server.url("/"), header_only)
        .await
        .is_ok());
}

#[tokio::test]
async fn error_statuses_are_refused() {
    for status in [404, 403, 500] {
        let server = Server::start(move |_| Reply::Status(status)).await;
        let err = fetcher(loopback_policy())
            .fetch(&server.url("/"), header_only)
            .await
            .unwrap_err();
        assert_eq!(err, FetchError::Status { status });
        assert_eq!(err.code(), "status");
    }
}

#[tokio::test]
async fn the_callers_stop_is_the_error() {
    let server = Server::start(|_| Reply::png(1 << 20)).await;
    let err = fetcher(loopback_policy())
        .fetch(&server.url("/"), |_| {
            Enough::Stop("image is 100000x100000 pixels".into())
        })
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FetchError::Refused("image is 100000x100000 pixels".into())
    );
}

#[tokio::test]
async fn https_to_a_plain_server_fails_in_tls() {
    let server = Server::start(|_| Reply::png(100)).await;
    let err = fetcher(loopback_policy())
        .fetch(&format!("https://{}/", server.addr), header_only)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
}

#[tokio::test]
async fn http_needs_the_policy() {
    let policy = FetchPolicy {
        allow_http: false,
        ..loopback_policy()
    };
    let err = fetcher(policy)
        .fetch("http://example.com/a.png", header_only)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "scheme");
}

#[tokio::test]
async fn an_allow_listed_network_is_fetched_from() {
    let server = Server::start(|_| Reply::png(100)).await;
    let port = server.addr.port();
    let policy = FetchPolicy {
        allow_networks: vec!["127.0.0.0/30".parse().unwrap()],
        ..loopback_policy()
    };
    let dns = ScriptedDns::new(&[&["127.0.0.1"]]);
    let fetcher = fetcher(policy).with_resolver(dns);
    assert!(fetcher
        .fetch(&format!("http://store.internal:{port}/"), header_only)
        .await
        .is_ok());
}

#[tokio::test]
async fn read_image_sends_each_url_its_way() {
    use kvgate_image_source::{read_image, DataUrlLimits, ImageSourceError};
    let server = Server::start(|_| Reply::png(100)).await;
    let fetcher = fetcher(loopback_policy());
    let limits = DataUrlLimits::default();
    let remote = read_image(&server.url("/"), &limits, &fetcher, header_only)
        .await
        .unwrap();
    assert_eq!(&remote.bytes[..PNG_HEADER.len()], PNG_HEADER);
    let inline = read_image(
        "data:image/png;base64,iVBORw0KGgo=",
        &limits,
        &fetcher,
        |_| Enough::Yes,
    )
    .await
    .unwrap();
    assert_eq!(inline.bytes, PNG_HEADER[..8]);
    let err = read_image("data:image/png,raw", &limits, &fetcher, header_only)
        .await
        .unwrap_err();
    assert_eq!((err.origin(), err.code()), ("inline", "not_base64"));
    let err = read_image("http://10.0.0.5/", &limits, &fetcher, header_only)
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        ImageSourceError::Fetch(FetchError::Forbidden { .. })
    ));
    assert_eq!(
        (err.origin(), err.code(), err.status()),
        ("remote", "forbidden_address", 400)
    );
}
