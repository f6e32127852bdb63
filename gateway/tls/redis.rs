//! The files of TLS to Redis (`[limits] redis_tls`), checked as kvgate checks its other
//! certificates (a CA bundle with a usable CA, a client certificate whose key belongs to
//! it) and handed over as PEM: the `redis` crate builds its own rustls config from PEM
//! bytes and takes no rustls config of ours.
//!
//! Read once at start: `[limits]` applies at start only, and the Redis clients keep what
//! they were built with, so a rotated file is used after a restart (unlike `[server.tls]`
//! and `[upstream.tls]`, which [`super::CertWatch`] reloads).

use std::path::Path;

use super::{files, provider, TlsError};

/// PEM bytes of a checked CA bundle and client identity.
#[derive(Clone)]
pub struct RedisPem {
    /// The CAs to trust instead of the system's roots.
    pub ca: Option<Vec<u8>>,
    /// kvgate's client certificate chain and its private key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key never reaches a log line.
        f.debug_struct("RedisPem")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl RedisPem {
    /// Read and check `ca_file` and the `cert_file`/`key_file` pair.
    pub fn read(ca_file: Option<&Path>, client: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let ca = match ca_file {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                let (added, _) = roots.add_parsable_certificates(files::certificates(path)?);
                if added == 0 {
                    return Err(TlsError::Cert {
                        path: path.display().to_string(),
                        reason: "no usable CA certificate in it".into(),
                    });
                }
                Some(bytes(path, |path, reason| TlsError::Cert { path, reason })?)
            }
            None => None,
        };
        let client = match client {
            Some((cert, key)) => {
                // Checked for a key that belongs to the chain here: the crate would only
                // find out at the first handshake.
                files::identity(cert, key, &provider())?;
                Some((
                    bytes(cert, |path, reason| TlsError::Cert { path, reason })?,
                    bytes(key, |path, reason| TlsError::Key { path, reason })?,
                ))
            }
            None => None,
        };
        Ok(Self { ca, client })
    }
}

fn bytes(path: &Path, fail: fn(String, String) -> TlsError) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| fail(path.display().to_string(), e.to_string()))
}

/// Make ring the process-wide rustls provider. The `redis` crate builds its TLS config
/// with `rustls::ClientConfig::builder()`, which takes the process default (and panics
/// when there is none to pick); kvgate's own configs name ring explicitly. Installing it
/// once is enough; a provider already installed (by an earlier call, or by an embedding
/// program) is kept.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
