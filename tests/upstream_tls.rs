//! TLS to engines end to end: `https://` workers behind a TLS front that the test builds
//! from certificates it generates (a CA, an engine certificate, a client certificate for
//! mTLS). A good CA and client certificate serve (discovery included); a wrong CA, a
//! missing client certificate or a wrong server name fail closed with a clear error and
//! nothing reaches the engine; and certificate files (the engines' CA, the data port's
//! own) are read again when they change or on `POST /reload`, without dropping open
//! connections.

mod support;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const TOKEN_ENV: &str = "KVGATE_UPSTREAM_TLS_TEST_TOKEN";
const TOKEN: &str = "upstream-tls-test-token";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA that signs leaf certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A leaf for `names`: (certificate PEM, key PEM, certificate DER).
    fn leaf(&self, names: &[&str]) -> (String, String, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    // Write then rename: a reader never sees half a file (as with a Secret's swap).
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// A TLS front for an engine: terminates TLS with `cert`/`key` (asking for a client
/// certificate signed by `client_ca` when given) and relays bytes to `backend`. Counts
/// completed handshakes.
struct TlsFront {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
}

async fn tls_front(
    backend: SocketAddr,
    cert: &str,
    key: &str,
    client_ca: Option<CertificateDer<'static>>,
) -> TlsFront {
    use rustls::pki_types::pem::PemObject;
    let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let counted = handshakes.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, counted) = (acceptor.clone(), counted.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    TlsFront { addr, handshakes }
}

/// A unified pool of one `https://` worker at `front` (capacity discovered unless `kv`).
fn https_pool(front: SocketAddr, server_name: &str, kv: Option<u64>) -> String {
    let kv = kv.map(|k| format!(", kv_tokens = {k}")).unwrap_or_default();
    unified_pool(
        "tls",
        &[format!(
            "{{ url = \"https://127.0.0.1:{}\", tls_server_name = \"{server_name}\"{kv} }}",
            front.port()
        )],
    )
}

/// The standard test config with `[upstream.tls]` set to `tls` (TOML lines) and an admin
/// token. Idle keep-alive connections live 60 s (`header_read_timeout`): the rotation test
/// keeps one open while it waits for certificates, which takes longer on a busy machine.
fn config(pools: &str, tls: &str, server: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    config_with_pools(WINDOW, pools)
        .replace(
            "[server]\n",
            &format!(
                "[server]\nadmin_token_env = \"{TOKEN_ENV}\"\ntls_watch_interval = \"50ms\"\nheader_read_timeout = \"60s\"\n"
            ),
        )
        .replace("[upstream]\n", &format!("{server}\n[upstream]\n"))
        .replace("[audit]\n", &format!("[upstream.tls]\n{tls}\n\n[audit]\n"))
}

fn chat(stream: bool) -> serde_json::Value {
    json!({"model": "qwen3", "max_tokens": 4, "stream": stream,
           "messages": [{"role": "user", "content": "hello over TLS"}]})
}

async fn chat_reply(gw: &RunningGateway, stream: bool) -> Reply {
    post(
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(KEY),
        &chat(stream),
    )
    .await
}

async fn plain_engine() -> RunningSim {
    engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_behind_mtls_serve_and_a_wrong_ca_client_certificate_or_name_fails_closed() {
    let dir = temp_dir("upstream-mtls");
    let ca = Ca::new("kvgate test engines CA");
    let (engine_cert, engine_key, _) = ca.leaf(&["engine.test"]);
    let (client_cert, client_key, _) = ca.leaf(&["kvgate.test"]);
    let ca_file = write(&dir, "ca.pem", &ca.pem());
    let cert_file = write(&dir, "client.pem", &client_cert);
    let key_file = write(&dir, "client.key", &client_key);
    let other_ca_file = write(&dir, "other-ca.pem", &Ca::new("someone else").pem());

    let engine = plain_engine().await;
    let front = tls_front(engine.http_addr, &engine_cert, &engine_key, Some(ca.der())).await;
    let mtls = format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
        path_str(&ca_file),
        path_str(&cert_file),
        path_str(&key_file)
    );

    // The right CA and client certificate: capacity is discovered over TLS, and whole and
    // streamed answers come back.
    let gw = gateway(&config(
        &https_pool(front.addr, "engine.test", None),
        &mtls,
        "",
    ))
    .await;
    let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    let reply = chat_reply(&gw, false).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["object"], "chat.completion");
    let streamed = chat_reply(&gw, true).await;
    assert_eq!(streamed.status, StatusCode::OK, "{}", streamed.text());
    assert_eq!(
        streamed.sse_data().last().map(String::as_str),
        Some("[DONE]")
    );
    assert_eq!(generations(&engine).len(), 2);
    assert!(front.handshakes.load(Ordering::SeqCst) >= 1);
    gw.shutdown().await;

    // Each failure: the worker's capacity cannot be discovered (it serves nothing, I3),
    // and with its capacity configured the request is a 502 naming the cause; the engine
    // gets nothing either way.
    let cases = [
        (
            "a CA that did not sign the engine's certificate",
            format!(
                "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
                path_str(&other_ca_file),
                path_str(&cert_file),
                path_str(&key_file)
            ),
            "engine.test",
            "UnknownIssuer",
        ),
        (
            "no client certificate for an engine that requires one",
            format!("ca_file = \"{}\"", path_str(&ca_file)),
            "engine.test",
            "CertificateRequired|connection was not ready",
        ),
        (
            "a server name the engine's certificate does not carry",
            mtls.clone(),
            "other.test",
            "certificate not valid for name \\\"other.test\\\"",
        ),
    ];
    for (what, tls, name, detail) in cases {
        let sent = generations(&engine).len();
        let gw = gateway(&config(&https_pool(front.addr, name, None), &tls, "")).await;
        let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
        assert_eq!(
            ready.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {}",
            ready.text()
        );
        eprintln!("{what}: /ready says {}", ready.text());
        // TLS 1.3 clients finish their handshake before the server judges their
        // certificate: the refusal (an alert) may race the first request, which then sees
        // a connection closed before it was ready.
        assert!(
            detail.split('|').any(|d| ready.text().contains(d)),
            "{what}: /ready names the cause `{detail}`: {}",
            ready.text()
        );
        let refused = chat_reply(&gw, false).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {}",
            refused.text()
        );
        gw.shutdown().await;

        let gw = gateway(&config(
            &https_pool(front.addr, name, Some(40960)),
            &tls,
            "",
        ))
        .await;
        let reply = chat_reply(&gw, false).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_GATEWAY,
            "{what}: {}",
            reply.text()
        );
        assert_eq!(error_code(&reply), "upstream_unavailable", "{what}");
        let streamed = chat_reply(&gw, true).await;
        assert!(
            !streamed.text().contains("[DONE]") && streamed.status != StatusCode::OK,
            "{what}: {}",
            streamed.text()
        );
        assert_eq!(
            generations(&engine).len(),
            sent,
            "{what}: nothing reached the engine"
        );
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn upstream_tls_settings_are_checked_at_load() {
    let dir = temp_dir("upstream-tls-config");
    let pem = write(&dir, "x.pem", "not a certificate");
    for (tls, worker, key) in [
        (
            "ca_file = \"/nonexistent/ca.pem\"",
            "",
            "upstream.tls.ca_file",
        ),
        (
            &format!("cert_file = \"{}\"", path_str(&pem)) as &str,
            "",
            "upstream.tls.key_file",
        ),
        (
            "server_name = \"not a name!\"",
            "",
            "upstream.tls.server_name",
        ),
        (
            "",
            ", tls_server_name = \"engine.test\"",
            "pools[0].workers[0].tls_server_name",
        ),
    ] {
        let pools = unified_pool(
            "p",
            &[format!(
                "{{ url = \"http://127.0.0.1:9\", kv_tokens = 4096{worker} }}"
            )],
        );
        let text = config(&pools, tls, "");
        let error = kvgate::config::Config::from_toml(&text, &repo().join("config/test.toml"))
            .expect_err(key)
            .to_string();
        assert!(error.contains(key), "{key}: {error}");
    }
    // A CA file that parses as config but holds no certificate stops the start, naming it.
    let text = config(
        &https_pool("127.0.0.1:9".parse().unwrap(), "engine.test", Some(4096)),
        &format!("ca_file = \"{}\"", path_str(&pem)),
        "",
    );
    let error = kvgate::runtime::Gateway::new(parse_config(&text))
        .expect_err("a CA file without certificates is refused")
        .to_string();
    assert!(error.contains("x.pem"), "{error}");
}

/// A TLS client of the data port that trusts `roots`; returns the certificate the server
/// presented and a sender on the open connection.
async fn tls_client(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
) -> (
    CertificateDer<'static>,
    hyper::client::conn::http1::SendRequest<Full<Bytes>>,
) {
    let mut store = rustls::RootCertStore::empty();
    for r in roots {
        store.add(r.clone()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    (presented, sender)
}

async fn chat_on(sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>) -> StatusCode {
    let request = http::Request::builder()
        .method(Method::POST)
        .uri("/v1/chat/completions")
        .header(http::header::HOST, "localhost")
        .header(http::header::AUTHORIZATION, format!("Bearer {KEY}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(chat(false).to_string())))
        .unwrap();
    // The connection takes the next request once its task has finished the last one:
    // sending at once after reading a body raced it ("connection was not ready", seen
    // once under load).
    sender
        .ready()
        .await
        .expect("the kept connection stays open");
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

/// Poll `test` until it holds (at most 10 s).
async fn eventually<F, Fut>(what: &str, mut test: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !test().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_read_again_when_they_change_and_on_reload_without_dropping_connections() {
    let dir = temp_dir("tls-rotation");
    let (old_ca, new_ca) = (Ca::new("old data-port CA"), Ca::new("new data-port CA"));
    let (old_cert, old_key, old_der) = old_ca.leaf(&["localhost"]);
    let (new_cert, new_key, new_der) = new_ca.leaf(&["localhost"]);
    let cert = write(&dir, "server.pem", &old_cert);
    let key = write(&dir, "server.key", &old_key);

    // The engine's CA file starts out wrong: the engine is unreachable until it is fixed.
    let engines_ca = Ca::new("engines CA");
    let (engine_cert, engine_key, _) = engines_ca.leaf(&["engine.test"]);
    let ca_file = write(&dir, "engines-ca.pem", &Ca::new("wrong CA").pem());
    let engine = plain_engine().await;
    let front = tls_front(engine.http_addr, &engine_cert, &engine_key, None).await;

    let text = config(
        &https_pool(front.addr, "engine.test", Some(40960)),
        &format!("ca_file = \"{}\"", path_str(&ca_file)),
        &format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            path_str(&cert),
            path_str(&key)
        ),
    );
    // From a real file, so POST /reload can read it again.
    let text = text.replace(
        "\"tokenizers/",
        &format!("\"{}/", repo().join("config/tokenizers").display()),
    );
    let config_path = write(&dir, "kvgate.toml", &text);
    let config = kvgate::config::Config::load(&config_path).unwrap();
    let gw = kvgate::runtime::Gateway::new(config)
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap();
    let roots = [old_ca.der(), new_ca.der()];

    let (presented, mut kept) = tls_client(gw.data_addr(), &roots).await;
    assert_eq!(presented, old_der);
    assert_eq!(
        chat_on(&mut kept).await,
        StatusCode::BAD_GATEWAY,
        "wrong CA"
    );

    // The right CA lands in the file: requests go through, without a restart.
    write(&dir, "engines-ca.pem", &engines_ca.pem());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while chat_on(&mut kept).await != StatusCode::OK {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engines' CA file was never read again"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // A new data-port certificate: new connections get it, the open one goes on.
    write(&dir, "server.key", &new_key);
    write(&dir, "server.pem", &new_cert);
    eventually("the new data-port certificate is served", || async {
        tls_client(gw.data_addr(), &roots).await.0 == new_der
    })
    .await;
    assert_eq!(
        chat_on(&mut kept).await,
        StatusCode::OK,
        "the open connection goes on"
    );

    // A broken certificate file: POST /reload refuses it, naming the file; the running
    // certificate keeps serving.
    write(&dir, "server.pem", "-----BEGIN CERTIFICATE-----\nbroken\n");
    let reload = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reload.status, StatusCode::BAD_REQUEST, "{}", reload.text());
    assert_eq!(error_code(&reload), "invalid_certificate");
    assert!(
        error_message(&reload).contains("server.pem"),
        "{}",
        reload.text()
    );
    let (presented, mut fresh) = tls_client(gw.data_addr(), &roots).await;
    assert_eq!(presented, new_der, "the running certificate stays");
    assert_eq!(chat_on(&mut fresh).await, StatusCode::OK);
    assert_eq!(chat_on(&mut kept).await, StatusCode::OK);

    // Fixed again: POST /reload reads it at once and says so.
    write(&dir, "server.pem", &new_cert);
    let reload = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    assert_eq!(reload.json()["certificates"]["server"], "reloaded");
    assert_eq!(reload.json()["certificates"]["engines"], "reloaded");
    let metrics = kvgate::metrics::handle().render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kvgate_tls_reloads_total") && l.contains("result=\"error\"")),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_taken_out_of_the_bundle_is_not_trusted_on_new_connections() {
    // Every engine request on a new connection (no idle pool), so the second one after the
    // CA file changed handshakes again: it must be verified against the new bundle, not
    // resume the earlier session.
    let dir = temp_dir("tls-ca-removed");
    let ca = Ca::new("engines CA");
    let (engine_cert, engine_key, _) = ca.leaf(&["engine.test"]);
    let ca_file = write(&dir, "ca.pem", &ca.pem());
    let engine = plain_engine().await;
    let front = tls_front(engine.http_addr, &engine_cert, &engine_key, None).await;
    let text = config(
        &https_pool(front.addr, "engine.test", Some(40960)),
        &format!("ca_file = \"{}\"", path_str(&ca_file)),
        "",
    )
    .replace("[upstream]\n", "[upstream]\nmax_idle_per_host = 0\n");
    let gw = gateway(&text).await;
    for _ in 0..2 {
        let reply = chat_reply(&gw, false).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    let handshakes = front.handshakes.load(Ordering::SeqCst);
    write(&dir, "ca.pem", &Ca::new("another CA").pem());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = chat_reply(&gw, false).await;
        if reply.status == StatusCode::BAD_GATEWAY {
            break;
        }
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert!(
            tokio::time::Instant::now() < deadline,
            "the engine stayed trusted after its CA left the bundle"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(handshakes >= 2, "one handshake per request: {handshakes}");
    gw.shutdown().await;
}
