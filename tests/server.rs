//! The listener: TLS with ALPN (h2 and http/1.1), h2c on the plain port, graceful drain.

mod support;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

fn generate_request(host: &str, stream: bool) -> Request<Full<Bytes>> {
    let body = json!({"text": "hello over the wire", "stream": stream, "sampling_params": {"max_new_tokens": 4}});
    Request::builder()
        .method("POST")
        .uri(format!("http://{host}/generate"))
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

#[tokio::test]
async fn h2c_and_http1_share_the_plain_port() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let addr = gw.data_addr();

    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let response = h2
        .send_request(generate_request(&addr.to_string(), false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.version(), http::Version::HTTP_2);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(serde_json::from_slice::<serde_json::Value>(&body).unwrap()["text"].is_string());

    let reply = post(
        &format!("http://{addr}/generate"),
        Some(KEY),
        &json!({"text": "h1"}),
    )
    .await;
    assert_eq!(reply.status, 200);
    gw.shutdown().await;
}

fn tls_files(
    dir: &std::path::Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    rustls::pki_types::CertificateDer<'static>,
) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_path = dir.join("server.pem");
    let key_path = dir.join("server.key");
    std::fs::write(&cert_path, cert.cert.pem()).unwrap();
    std::fs::write(&key_path, cert.signing_key.serialize_pem()).unwrap();
    (cert_path, key_path, cert.cert.der().clone())
}

fn tls_connector(
    der: rustls::pki_types::CertificateDer<'static>,
    alpn: &[u8],
) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test]
async fn tls_terminates_with_alpn_h2_and_http1() {
    let dir = std::env::temp_dir().join(format!("kvgate-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, der) = tls_files(&dir);
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let text = config_with_pools(WINDOW, &unified_pool("u", &[worker(&engine, None)])).replace(
        "[upstream]",
        &format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[upstream]",
            cert.display(),
            key.display()
        ),
    );
    let gw = gateway(&text).await;
    let addr = gw.data_addr();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();

    for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let tls = tls_connector(der.clone(), alpn)
            .connect(name.clone(), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        let io = TokioIo::new(tls);
        let response = if alpn == b"h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            sender
                .send_request(generate_request("localhost", true))
                .await
                .unwrap()
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            sender
                .send_request(generate_request("localhost", true))
                .await
                .unwrap()
        };
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let data = sse_data(&String::from_utf8_lossy(&body));
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    }

    // A plain-text client on the TLS port gets no HTTP answer, and the server stays up.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
                .await
                .unwrap();
        tokio::spawn(conn);
        sender
            .send_request(generate_request("localhost", false))
            .await
    })
    .await
    .expect("no hang");
    assert!(plain.is_err());
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn graceful_drain_completes_an_in_flight_stream_and_refuses_new_connections() {
    let engine = slow_engine(WINDOW as usize, 25).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let addr = gw.data_addr();
    let body = json!({"text": "drain me gently ".repeat(10), "stream": true, "sampling_params": {"max_new_tokens": 30}});
    let response = send(request(
        http::Method::POST,
        &format!("http://{addr}/generate"),
        Some(KEY),
        body.to_string(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = String::new();
    let first = body.frame().await.unwrap().unwrap();
    text.push_str(&String::from_utf8_lossy(first.data_ref().unwrap()));

    gw.begin_shutdown();
    // The listener closes: new connections are refused while the stream goes on.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "listener still accepting after shutdown"
        );
        tokio::task::yield_now().await;
    }
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let data = sse_data(&text);
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "the stream finished: {data:?}"
    );
    assert!(data.len() >= 31);
    tokio::time::timeout(Duration::from_secs(10), gw.wait())
        .await
        .expect("drain finishes");
}

/// A burst of `n` connections at once, each asking `GET /v1/models` and reading the answer
/// to its end; the status lines that came back (an empty one: no answer, a reset).
async fn connection_burst(addr: std::net::SocketAddr, n: usize) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "GET /v1/models HTTP/1.1\r\nHost: kvgate\r\nAuthorization: Bearer {KEY}\r\nConnection: close\r\n\r\n"
    );
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let request = request.clone();
            tokio::spawn(async move {
                let answer = async {
                    let mut stream = tokio::net::TcpStream::connect(addr).await?;
                    stream.write_all(request.as_bytes()).await?;
                    let mut reply = Vec::new();
                    stream.read_to_end(&mut reply).await?;
                    Ok::<_, std::io::Error>(reply)
                };
                match tokio::time::timeout(Duration::from_secs(60), answer).await {
                    Ok(Ok(reply)) => String::from_utf8_lossy(&reply)
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_owned(),
                    Ok(Err(e)) => format!("error: {e}"),
                    Err(_) => "no answer within 60 s".to_owned(),
                }
            })
        })
        .collect();
    let mut lines = Vec::new();
    for t in tasks {
        lines.push(t.await.expect("client task"));
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_a_thousand_connections_waits_in_the_accept_queue_and_is_served() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    let text = config_with_pools(WINDOW, &unified_pool("u", &[worker(&engine, None)]))
        .replace(
            "[server]\n",
            // Few connections at once: most of the burst waits in the accept queue.
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmax_connections = 32\n",
        );
    let gw = kvgate::runtime::Gateway::new(parse_config(&text))
        .expect("gateway builds")
        .bind_and_start()
        .await
        .expect("gateway starts");
    let lines = connection_burst(gw.data_addr(), 1000).await;
    let failed: Vec<&String> = lines.iter().filter(|l| !l.contains(" 200 ")).collect();
    assert!(
        failed.is_empty(),
        "{} of 1000 connections got no answer: {:?}",
        failed.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    gw.shutdown().await;
}
