//! Certificates that may change while the gateway runs: the data port's own
//! (`[server.tls]`) and those of TLS to engines (`[upstream.tls]`: the CAs trusted for
//! `https://` workers and kvgate's client certificate for mTLS).
//!
//! Each lives behind a swappable pointer that rustls asks on every new handshake
//! ([`ServerCert`], [`EngineTls`]), so a reload takes effect for new connections while open
//! ones (and the streams on them) go on untouched. [`CertWatch`] reads the files again when
//! they change on disk, or at once on SIGHUP and `POST /reload`; files that fail to load
//! leave the running certificates in place, and the failure is logged and counted.
//!
//! TLS to Redis (`[limits] redis_tls`) is read here too ([`RedisPem`]), but once, at start.

mod engines;
mod files;
mod redis;
mod server;
mod watch;

pub use engines::EngineTls;
pub use redis::{install_default_provider, RedisPem};
pub use server::ServerCert;
pub use watch::{CertWatch, ReadCertificates, Reloaded};

use std::sync::Arc;

/// A certificate or key that could not be used, naming the file (or the key it came from).
#[derive(Debug, Clone, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read TLS certificate {path}: {reason}")]
    Cert { path: String, reason: String },
    #[error("cannot read TLS private key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("TLS certificate and key do not form a valid identity: {0}")]
    Config(String),
    #[error("no CA to trust for https:// workers: {0}")]
    Roots(String),
}

/// The one crypto provider (ring): aws-lc-rs is kept out of the build.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
