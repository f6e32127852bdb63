//! `[upstream]`: how the gateway talks to engines, and its deadlines there.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::resolve;
use super::invalid::{deadline, Invalid};

/// `[upstream]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// TCP connect timeout to an engine.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Streaming requests: until the engine's response headers arrive. (A non-streaming
    /// answer's headers come with the whole answer, so `request_timeout` bounds those.)
    #[serde(with = "humantime_serde")]
    pub response_header_timeout: Duration,
    /// Streaming requests: longest silence between two chunks once the stream started; a
    /// stalled stream ends with an SSE error event (no `[DONE]`).
    #[serde(with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// The whole exchange with the engine, streams included.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Largest non-streamed engine answer read into memory (502 above it).
    pub max_response_bytes: bytesize::ByteSize,
    /// Share of requests that may be retried on another worker after a connect failure
    /// (nothing was sent yet); at least one retry per second is always allowed.
    pub retry_budget_ratio: f64,
    /// How often worker capacity is re-discovered from `/get_server_info`.
    #[serde(with = "humantime_serde")]
    pub discovery_interval: Duration,
    /// Idle keep-alive connections kept per engine.
    pub max_idle_per_host: usize,
    /// How long an idle upstream connection is kept.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// `[upstream.tls]`: how `https://` workers are trusted and how kvgate proves itself
    /// to them (mTLS).
    pub tls: UpstreamTlsConfig,
}

/// `[upstream.tls]`: TLS to engines. Every file is read again when it changes (and on
/// SIGHUP or `POST /reload`); new engine connections use the new files, open ones go on.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of the CAs that sign the engines' certificates (default: the system's
    /// roots). Nothing else is trusted: an engine whose certificate does not chain to it
    /// is unreachable, never served unverified.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain kvgate presents (mTLS); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// The name sent as SNI and checked in every engine's certificate, instead of the
    /// URL's host (engines addressed by IP). A worker's `tls_server_name` overrides it.
    pub server_name: Option<String>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            response_header_timeout: Duration::from_secs(60),
            stream_idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(600),
            max_response_bytes: bytesize::ByteSize::mib(64),
            retry_budget_ratio: 0.1,
            discovery_interval: Duration::from_secs(30),
            max_idle_per_host: 64,
            idle_timeout: Duration::from_secs(90),
            tls: UpstreamTlsConfig::default(),
        }
    }
}

impl UpstreamConfig {
    /// The rules of `[upstream]`: deadlines and ceilings are positive, and `[upstream.tls]`
    /// names files that exist (resolved against `base`), a client certificate with its key,
    /// and a server name that is a name.
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        for (key, value) in [
            ("upstream.connect_timeout", self.connect_timeout),
            (
                "upstream.response_header_timeout",
                self.response_header_timeout,
            ),
            ("upstream.stream_idle_timeout", self.stream_idle_timeout),
            ("upstream.request_timeout", self.request_timeout),
        ] {
            deadline(key, value)?;
        }
        if self.max_response_bytes.as_u64() == 0 {
            return Err(Invalid::new(
                "upstream.max_response_bytes",
                "must be positive, e.g. \"64MiB\"",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry_budget_ratio) {
            return Err(Invalid::new(
                "upstream.retry_budget_ratio",
                "must be between 0 and 1 (0.1: one retry per ten requests)",
            ));
        }
        self.tls.check(base)
    }
}

impl UpstreamTlsConfig {
    fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        for (key, file) in [
            ("upstream.tls.ca_file", &mut self.ca_file),
            ("upstream.tls.cert_file", &mut self.cert_file),
            ("upstream.tls.key_file", &mut self.key_file),
        ] {
            if let Some(f) = file.as_mut() {
                resolve(base, f, key)?;
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(Invalid::new(
                    "upstream.tls.key_file",
                    "a client certificate (cert_file) needs its private key: key_file = \"...\"",
                ))
            }
            (None, Some(_)) => {
                return Err(Invalid::new(
                    "upstream.tls.cert_file",
                    "a client key (key_file) needs its certificate chain: cert_file = \"...\"",
                ))
            }
            _ => {}
        }
        if let Some(name) = &self.server_name {
            check_server_name(name).map_err(|r| Invalid::new("upstream.tls.server_name", r))?;
        }
        Ok(())
    }
}

/// A TLS server name (`upstream.tls.server_name`, a worker's `tls_server_name`) must be
/// one rustls can send as SNI and check in a certificate.
pub(super) fn check_server_name(name: &str) -> Result<(), String> {
    if rustls_pki_types::ServerName::try_from(name).is_err() {
        return Err(format!(
            "`{name}` is not a DNS name or IP address, e.g. \"engine.internal\""
        ));
    }
    Ok(())
}
