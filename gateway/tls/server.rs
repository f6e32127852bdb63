//! The data port's certificate (`[server.tls]`), swappable while connections are open.

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use tokio_rustls::TlsAcceptor;

use super::{files, provider, TlsError};

/// The data port's identity: read from `cert`/`key`, handed to every new handshake.
#[derive(Debug)]
pub struct ServerCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServerCert {
    /// Read the PEM chain and key (both must be valid: start-up fails otherwise).
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let identity = files::identity(cert, key, &provider())?;
        Ok(Arc::new(Self {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(identity),
        }))
    }

    /// Read the files again; on an error the running certificate stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        self.install(self.read()?);
        Ok(())
    }

    /// Read the files into a new identity without using it yet.
    pub(super) fn read(&self) -> Result<Arc<CertifiedKey>, TlsError> {
        files::identity(&self.cert, &self.key, &provider())
    }

    /// Use `identity` for the next handshakes.
    pub(super) fn install(&self, identity: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = identity;
    }

    /// The files it is read from.
    pub fn files(&self) -> [&Path; 2] {
        [&self.cert, &self.key]
    }

    /// A rustls acceptor (ALPN h2, http/1.1) that asks this certificate on each handshake.
    pub fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

impl ResolvesServerCert for ServerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}
