//! `[upstream]`: how the gateway talks to engines, and its deadlines there.

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

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
