//! TLS to engines (`[upstream.tls]`): which CAs are trusted for `https://` workers, the
//! client certificate kvgate presents (mTLS), and the name each engine's certificate must
//! carry (SNI override). One [`EngineTls`] is shared by every engine client of the process
//! (one per data thread, one for discovery and probes), so a reload reaches them all.
//!
//! Fail closed: an engine whose certificate does not chain to a trusted CA, or names
//! another host, is unreachable (502 `upstream_unavailable`, discovery fails, so a worker
//! without configured capacity serves nothing: I3). Nothing is ever sent unverified.

use http::Uri;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, ResolveServerName};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::{files, provider, TlsError};
use crate::config::Config;

/// Trusted CAs and a client certificate, read but not yet in use.
#[derive(Debug)]
pub(super) struct EngineMaterial {
    verifier: Option<Arc<WebPkiServerVerifier>>,
    identity: Option<Arc<CertifiedKey>>,
}

/// The TLS settings of every engine connection.
#[derive(Debug)]
pub struct EngineTls {
    ca_file: Option<PathBuf>,
    /// Some worker is `https://`: without a `ca_file` the system's roots are needed.
    any_https: std::sync::atomic::AtomicBool,
    client_files: Option<(PathBuf, PathBuf)>,
    verifier: Arc<TrustedCas>,
    identity: Arc<ClientIdentity>,
    names: Arc<ServerNames>,
    client_config: rustls::ClientConfig,
}

impl EngineTls {
    /// From validated config. The system's roots are read only when no `ca_file` is set
    /// and some worker is `https://`.
    pub fn from_config(config: &Config) -> Result<Arc<Self>, TlsError> {
        let tls = &config.upstream.tls;
        let any_https = has_https(config);
        let verifier = Arc::new(TrustedCas {
            current: RwLock::new(verifier(tls.ca_file.as_deref(), any_https)?),
        });
        let client_files = tls.cert_file.clone().zip(tls.key_file.clone());
        let identity = Arc::new(ClientIdentity {
            current: RwLock::new(match &client_files {
                Some((cert, key)) => Some(files::identity(cert, key, &provider())?),
                None => None,
            }),
        });
        let names = Arc::new(ServerNames::default());
        names.set(config);
        let client_config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            // Not a weaker check: it delegates to webpki's verifier of the trusted CAs,
            // which a reload swaps (rustls fixes the verifier when the config is built).
            .with_custom_certificate_verifier(verifier.clone())
            .with_client_cert_resolver(identity.clone());
        // No session resumption: a resumed TLS 1.3 session is not verified again, so a CA
        // taken out of `ca_file` (or a client certificate replaced) would still be trusted on
        // resumed connections. Engine connections are pooled; full handshakes are rare.
        let mut client_config = client_config;
        client_config.resumption = rustls::client::Resumption::disabled();
        Ok(Arc::new(Self {
            ca_file: tls.ca_file.clone(),
            any_https: any_https.into(),
            client_files,
            verifier,
            identity,
            names,
            client_config,
        }))
    }

    /// Read the CA bundle (or the system's roots) and the client certificate again. All or
    /// nothing: on an error the running ones stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.install(self.read()?);
        Ok(())
    }

    /// Read the CA bundle and client certificate into new material without using it yet.
    pub(super) fn read(&self) -> Result<EngineMaterial, TlsError> {
        let any_https = self.any_https.load(std::sync::atomic::Ordering::Relaxed);
        Ok(EngineMaterial {
            verifier: verifier(self.ca_file.as_deref(), any_https)?,
            identity: match &self.client_files {
                Some((cert, key)) => Some(files::identity(cert, key, &provider())?),
                None => None,
            },
        })
    }

    /// Use `material` for the next engine connections.
    pub(super) fn install(&self, material: EngineMaterial) {
        *self
            .verifier
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = material.verifier;
        *self
            .identity
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner()) = material.identity;
    }

    /// A reloaded config's workers: their server names, and (without a `ca_file`) the
    /// system's roots once the first `https://` worker appears. `[upstream.tls]` itself
    /// changes only with a restart.
    pub fn reconfigure(&self, config: &Config) -> Result<(), TlsError> {
        let any_https = has_https(config);
        let had = self.any_https.load(std::sync::atomic::Ordering::Relaxed);
        if any_https && !had && self.ca_file.is_none() {
            let roots = verifier(None, true)?;
            *self
                .verifier
                .current
                .write()
                .unwrap_or_else(|p| p.into_inner()) = roots;
        }
        self.any_https
            .store(any_https || had, std::sync::atomic::Ordering::Relaxed);
        self.names.set(config);
        Ok(())
    }

    /// The files it reads (watched for changes).
    pub fn files(&self) -> Vec<&Path> {
        let mut files: Vec<&Path> = self.ca_file.iter().map(PathBuf::as_path).collect();
        if let Some((cert, key)) = &self.client_files {
            files.extend([cert.as_path(), key.as_path()]);
        }
        files
    }

    /// Whether kvgate presents a client certificate (mTLS).
    pub fn has_client_certificate(&self) -> bool {
        self.client_files.is_some()
    }

    /// An engine connector: plain TCP for `http://` workers, TLS with these settings for
    /// `https://` ones (HTTP/1.1, as to plain engines).
    pub fn connector(&self, http: HttpConnector) -> HttpsConnector<HttpConnector> {
        HttpsConnectorBuilder::new()
            .with_tls_config(self.client_config.clone())
            .https_or_http()
            .with_server_name_resolver(NameOf(self.names.clone()))
            .enable_http1()
            .wrap_connector(http)
    }
}

fn has_https(config: &Config) -> bool {
    config
        .pools
        .iter()
        .flat_map(|p| p.workers.iter().chain(&p.prefill).chain(&p.decode))
        .any(|w| w.url.scheme_str() == Some("https"))
}

/// The verifier of the trusted CAs; `None` when there is none to trust (no `ca_file` and
/// no system roots), which refuses every engine certificate.
fn verifier(
    ca_file: Option<&Path>,
    any_https: bool,
) -> Result<Option<Arc<WebPkiServerVerifier>>, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let (added, _) = roots.add_parsable_certificates(files::certificates(path)?);
            if added == 0 {
                return Err(TlsError::Cert {
                    path: path.display().to_string(),
                    reason: "no usable CA certificate in it".into(),
                });
            }
        }
        None if !any_https => return Ok(None),
        None => {
            let native = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(native.certs);
            if roots.is_empty() {
                let errors: Vec<String> = native.errors.iter().map(|e| e.to_string()).collect();
                return Err(TlsError::Roots(format!(
                    "the system has no CA certificates ({}); set upstream.tls.ca_file to the engines' CA bundle",
                    if errors.is_empty() { "none found".into() } else { errors.join("; ") }
                )));
            }
        }
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map(Some)
        .map_err(|e| TlsError::Config(e.to_string()))
}

/// The trusted CAs, swappable.
#[derive(Debug)]
struct TrustedCas {
    current: RwLock<Option<Arc<WebPkiServerVerifier>>>,
}

impl TrustedCas {
    fn get(&self) -> Result<Arc<WebPkiServerVerifier>, rustls::Error> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                rustls::Error::General(
                    "no CA is trusted for https:// workers: set upstream.tls.ca_file".into(),
                )
            })
    }
}

impl ServerCertVerifier for TrustedCas {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.get()?
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// kvgate's client certificate for mTLS, swappable (`None`: none is presented).
#[derive(Debug)]
struct ClientIdentity {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ResolvesClientCert for ClientIdentity {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn has_certs(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }
}

/// The name each `https://` worker's certificate must carry, by `host:port`: its
/// `tls_server_name`, else `upstream.tls.server_name`; workers not listed use their host.
#[derive(Debug, Default)]
struct ServerNames {
    by_authority: RwLock<HashMap<String, ServerName<'static>>>,
}

impl ServerNames {
    fn set(&self, config: &Config) {
        let default = config.upstream.tls.server_name.as_deref();
        let names = config
            .pools
            .iter()
            .flat_map(|p| p.workers.iter().chain(&p.prefill).chain(&p.decode))
            .filter(|w| w.url.scheme_str() == Some("https"))
            .filter_map(|w| {
                let name = w.tls_server_name.as_deref().or(default)?;
                let name = ServerName::try_from(name.to_owned()).ok()?;
                Some((w.url.authority()?.to_string(), name))
            })
            .collect();
        *self.by_authority.write().unwrap_or_else(|p| p.into_inner()) = names;
    }
}

/// hyper-rustls asks this for the SNI name of each new connection.
struct NameOf(Arc<ServerNames>);

impl ResolveServerName for NameOf {
    fn resolve(
        &self,
        uri: &Uri,
    ) -> Result<ServerName<'static>, Box<dyn std::error::Error + Sync + Send>> {
        if let Some(authority) = uri.authority() {
            let names = self
                .0
                .by_authority
                .read()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(name) = names.get(authority.as_str()) {
                return Ok(name.clone());
            }
        }
        let host = uri.host().unwrap_or_default();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Ok(ServerName::try_from(host.to_owned())?)
    }
}
