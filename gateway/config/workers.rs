//! One engine process of a pool (`workers`, `prefill` and `decode` entries).

use serde::Deserialize;

use super::invalid::Invalid;
use super::upstream::check_server_name;

/// One engine process.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Base URL, e.g. `http://10.0.0.1:30000`.
    #[serde(with = "http_serde_uri")]
    pub url: http::Uri,
    /// KV pool size in tokens; the smaller of this and the discovered value is enforced.
    #[serde(default)]
    pub kv_tokens: Option<u64>,
    /// Requests the engine runs at once (SGLang's `--max-running-requests`, vLLM's
    /// `--max-num-seqs`, llama.cpp's `--parallel`); the smaller of this, the pool's
    /// `max_running` and what the engine reports is enforced. Unset and unreported: only
    /// KV bounds what kvgate sends.
    #[serde(default)]
    pub max_running: Option<u32>,
    /// Prefill workers: the KV bootstrap port (else discovered from the engine).
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Prefill workers: the host decode workers reach for KV (default: the URL's host).
    #[serde(default)]
    pub bootstrap_host: Option<String>,
    /// `https://` workers: the name sent as SNI and checked in the certificate, instead
    /// of the URL's host and `upstream.tls.server_name`.
    #[serde(default)]
    pub tls_server_name: Option<String>,
}

impl WorkerConfig {
    /// The rules of one worker; keys are relative to it (`url`). Only prefill workers run a
    /// KV bootstrap server.
    pub(super) fn check(&self, is_prefill: bool) -> Result<(), Invalid> {
        match self.url.scheme_str() {
            Some("http" | "https") => {}
            _ => {
                return Err(Invalid::new(
                    "url",
                    "must start with http:// or https://, e.g. \"http://10.0.0.1:30000\"",
                ))
            }
        }
        if self.url.host().is_none() {
            return Err(Invalid::new(
                "url",
                "must name a host, e.g. \"http://10.0.0.1:30000\"",
            ));
        }
        if !matches!(self.url.path(), "" | "/") || self.url.query().is_some() {
            return Err(Invalid::new(
                "url",
                "must be a base URL without a path or query",
            ));
        }
        if self.kv_tokens == Some(0) {
            return Err(Invalid::new(
                "kv_tokens",
                "must be the KV pool size in tokens (SGLang's max_total_num_tokens), or left out to discover it",
            ));
        }
        if self.max_running == Some(0) {
            return Err(Invalid::new(
                "max_running",
                "must be at least 1 (the engine's --max-running-requests), or left out to discover it",
            ));
        }
        if !is_prefill && (self.bootstrap_port.is_some() || self.bootstrap_host.is_some()) {
            return Err(Invalid::new(
                "bootstrap_port",
                "only prefill workers have a KV bootstrap server; remove it here",
            ));
        }
        if let Some(name) = &self.tls_server_name {
            if self.url.scheme_str() != Some("https") {
                return Err(Invalid::new(
                    "tls_server_name",
                    "only https:// workers use a TLS server name",
                ));
            }
            check_server_name(name).map_err(|r| Invalid::new("tls_server_name", r))?;
        }
        Ok(())
    }
}

mod http_serde_uri {
    use serde::{de::Error, Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<http::Uri>().map_err(|e| {
            D::Error::custom(format!(
                "`{s}` is not a URL ({e}); write e.g. \"http://10.0.0.1:30000\""
            ))
        })
    }
}
