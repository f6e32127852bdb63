//! One engine process of a pool (`workers`, `prefill` and `decode` entries), or, with
//! `discover`, a DNS name standing for every engine process it lists (issue 39).

use serde::Deserialize;

use super::invalid::Invalid;
use super::upstream::check_server_name;

/// How an entry's URL host names its engines.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Discover {
    /// Every A/AAAA address of the host is one worker at the URL's port (a Kubernetes
    /// headless Service).
    Dns,
    /// The host is an SRV name (`_http._tcp.engines.ns.svc.cluster.local`): every target
    /// and port it lists is one worker.
    Srv,
}

impl Discover {
    /// A metric label and admin field.
    pub fn as_str(self) -> &'static str {
        match self {
            Discover::Dns => "dns",
            Discover::Srv => "srv",
        }
    }
}

/// One engine process, or (with `discover`) the engines a DNS name lists.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Base URL, e.g. `http://10.0.0.1:30000`; with `discover`, the URL of a DNS name.
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
    /// Resolve the URL's host on `[discovery] interval` and serve every engine it lists,
    /// each with this entry's other settings.
    #[serde(default)]
    pub discover: Option<Discover>,
    /// Prefill entries with `discover`: an SRV name whose records give each engine's KV
    /// bootstrap port (matched by address), e.g. `_bootstrap._tcp.prefill.ns.svc.cluster.local`.
    #[serde(default)]
    pub bootstrap_srv: Option<String>,
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
        self.check_discover(is_prefill)
    }

    /// The rules of a `discover` entry: a name to resolve, a port where it comes from.
    fn check_discover(&self, is_prefill: bool) -> Result<(), Invalid> {
        let Some(discover) = self.discover else {
            if self.bootstrap_srv.is_some() {
                return Err(Invalid::new(
                    "bootstrap_srv",
                    "only entries with discover = \"dns\" or \"srv\" look up bootstrap ports; write bootstrap_port here instead",
                ));
            }
            return Ok(());
        };
        let host = self.url.host().unwrap_or_default();
        if host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok()
        {
            return Err(Invalid::new(
                "url",
                "discover needs a DNS name, not an address, e.g. \"http://engines.ns.svc.cluster.local:30000\"; remove `discover` for one engine",
            ));
        }
        if discover == Discover::Srv && self.url.port().is_some() {
            return Err(Invalid::new(
                "url",
                "with discover = \"srv\" the port comes from the SRV records: remove `:port`, e.g. \"http://_http._tcp.engines.ns.svc.cluster.local\"",
            ));
        }
        if self.bootstrap_host.is_some() {
            return Err(Invalid::new(
                "bootstrap_host",
                "a discovered engine's bootstrap host is its own address; remove bootstrap_host",
            ));
        }
        if let Some(name) = &self.bootstrap_srv {
            if !is_prefill {
                return Err(Invalid::new(
                    "bootstrap_srv",
                    "only prefill workers have a KV bootstrap server; remove it here",
                ));
            }
            if self.bootstrap_port.is_some() {
                return Err(Invalid::new(
                    "bootstrap_srv",
                    "give the bootstrap port once: bootstrap_port (the same for every engine) or bootstrap_srv, not both",
                ));
            }
            if name.trim().is_empty() || name.contains(['/', ':', ' ']) {
                return Err(Invalid::new(
                    "bootstrap_srv",
                    format!("`{name}` is not a DNS name; write e.g. \"_bootstrap._tcp.prefill.ns.svc.cluster.local\""),
                ));
            }
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
