//! The https path end to end: a TLS image server with a certificate from a test CA. The
//! fetcher connects to the address it checked (the scripted DNS's answer) while TLS still
//! verifies the URL's name (SNI and certificate) and `Host` carries it.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use kvgate_image_source::{Enough, FetchPolicy, ImageFetcher};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use support::{Reply, ScriptedDns, Stats, PNG_HEADER};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a leaf it signed for `names`.
struct Pki {
    ca: CertificateDer<'static>,
    leaf: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
}

fn pki(names: &[&str]) -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    let leaf = params.signed_by(&key, &issuer).unwrap();
    Pki {
        ca: issuer.der().clone(),
        leaf: leaf.der().clone(),
        key: PrivatePkcs8KeyDer::from(key.serialize_der()).into(),
    }
}

/// A TLS image server on 127.0.0.1:0; records the SNI each handshake asked for.
async fn tls_server(
    pki: &Pki,
    reply: Reply,
) -> (SocketAddr, Arc<Stats>, Arc<Mutex<Vec<Option<String>>>>) {
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![pki.leaf.clone()], pki.key.clone_key())
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(Stats::default());
    let names = Arc::new(Mutex::new(Vec::new()));
    let (shared, seen) = (stats.clone(), names.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            shared.connections.fetch_add(1, Ordering::SeqCst);
            let (acceptor, stats, seen, reply) = (
                acceptor.clone(),
                shared.clone(),
                seen.clone(),
                reply.clone(),
            );
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    seen.lock()
                        .unwrap()
                        .push(tls.get_ref().1.server_name().map(str::to_owned));
                    let _ = support::handle(tls, &stats, &move |_: &str| reply.clone()).await;
                }
                stats.ended.notify_one();
            });
        }
    });
    (addr, stats, names)
}

fn trusting(ca: &CertificateDer<'static>, dns: Arc<ScriptedDns>) -> ImageFetcher {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let policy = FetchPolicy {
        allow_networks: vec!["127.0.0.1/32".parse().unwrap()],
        ..FetchPolicy::allowing()
    };
    ImageFetcher::with_tls_config(policy, Arc::new(tls)).with_resolver(dns)
}

fn header_only(bytes: &[u8]) -> Enough {
    if bytes.len() >= PNG_HEADER.len() {
        Enough::Yes
    } else {
        Enough::NeedMore {
            at_least: PNG_HEADER.len(),
        }
    }
}

#[tokio::test]
async fn https_verifies_the_name_at_the_checked_address() {
    let pki = pki(&["images.test"]);
    let (addr, stats, names) = tls_server(&pki, Reply::png(1 << 20)).await;
    let dns = ScriptedDns::new(&[&["127.0.0.1"], &["10.0.0.5"]]);
    let prefix = trusting(&pki.ca, dns.clone())
        .fetch(
            &format!("https://images.test:{}/cat.png", addr.port()),
            header_only,
        )
        .await
        .unwrap();
    assert_eq!(&prefix.bytes[..PNG_HEADER.len()], PNG_HEADER);
    assert_eq!(dns.lookups(), 1);
    assert_eq!(*names.lock().unwrap(), [Some("images.test".to_string())]);
    let head = stats.requests()[0].to_ascii_lowercase();
    assert!(
        head.contains(&format!("host: images.test:{}\r\n", addr.port())),
        "{head}"
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let pki_server = pki(&["images.test"]);
    let other = pki(&["images.test"]);
    let (addr, stats, _) = tls_server(&pki_server, Reply::png(100)).await;
    let err = trusting(&other.ca, ScriptedDns::new(&[&["127.0.0.1"]]))
        .fetch(
            &format!("https://images.test:{}/", addr.port()),
            header_only,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
    assert!(
        stats.requests().is_empty(),
        "no request went out unverified"
    );
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    let pki = pki(&["other.test"]);
    let (addr, stats, _) = tls_server(&pki, Reply::png(100)).await;
    let err = trusting(&pki.ca, ScriptedDns::new(&[&["127.0.0.1"]]))
        .fetch(
            &format!("https://images.test:{}/", addr.port()),
            header_only,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "tls", "{err}");
    assert!(err.to_string().contains("images.test"), "{err}");
    assert!(stats.requests().is_empty());
}
