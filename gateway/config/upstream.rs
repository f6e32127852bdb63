//! `[upstream]`: how the gateway talks to engines, and its deadlines there.

use serde::Deserialize;
use std::path::{Path, PathBuf};
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

/// `[upstream.tls]`: files exist (resolved against the config's folder), a client
/// certificate comes with its key, server names are names.
pub(super) fn check_tls(config: &mut super::Config, base: &Path) -> Result<(), (String, String)> {
    let tls = &mut config.upstream.tls;
    for (key, file) in [
        ("ca_file", &mut tls.ca_file),
        ("cert_file", &mut tls.cert_file),
        ("key_file", &mut tls.key_file),
    ] {
        if let Some(f) = file.as_mut() {
            *f = super::validate::existing_file(base, f)
                .map_err(|r| (format!("upstream.tls.{key}"), r))?;
        }
    }
    match (&tls.cert_file, &tls.key_file) {
        (Some(_), None) => {
            return Err((
                "upstream.tls.key_file".into(),
                "a client certificate (cert_file) needs its private key: key_file = \"...\"".into(),
            ))
        }
        (None, Some(_)) => {
            return Err((
                "upstream.tls.cert_file".into(),
                "a client key (key_file) needs its certificate chain: cert_file = \"...\"".into(),
            ))
        }
        _ => {}
    }
    let server_name_error =
        |name: &str| format!("`{name}` is not a DNS name or IP address, e.g. \"engine.internal\"");
    if let Some(name) = &tls.server_name {
        if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
            return Err(("upstream.tls.server_name".into(), server_name_error(name)));
        }
    }
    for (i, pool) in config.pools.iter().enumerate() {
        for (list, workers) in [
            ("workers", &pool.workers),
            ("prefill", &pool.prefill),
            ("decode", &pool.decode),
        ] {
            for (j, w) in workers.iter().enumerate() {
                let Some(name) = &w.tls_server_name else {
                    continue;
                };
                let key = format!("pools[{i}].{list}[{j}].tls_server_name");
                if w.url.scheme_str() != Some("https") {
                    return Err((key, "only https:// workers use a TLS server name".into()));
                }
                if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
                    return Err((key, server_name_error(name)));
                }
            }
        }
    }
    Ok(())
}
