//! One hop's URL, checked before any lookup: a scheme the policy fetches, no credentials,
//! a host, and the request line and `Host` header to send.
//!
//! URLs are parsed the WHATWG way (the `url` crate, what browsers do), which turns every
//! spelling of an IPv4 address (`2130706433`, `0x7f.1`, `0177.0.0.1`) into its one
//! canonical address and refuses hosts that end in a number but are not one. So an IP in
//! disguise is checked as the address it is; a name is always a name, looked up by DNS.

use std::net::IpAddr;

use url::{Host, Url};

use super::FetchError;
use crate::policy::FetchPolicy;

/// Longer URLs are refused unread: no image store needs them, and a hop's URL goes into a
/// request line.
const MAX_URL_LEN: usize = 8 << 10;

/// The host of a hop: a name to resolve, or an address to check as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TargetHost {
    Name(String),
    Ip(IpAddr),
}

/// A checked hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) url: Url,
    pub(crate) https: bool,
    pub(crate) host: TargetHost,
    pub(crate) port: u16,
}

// === impl Target ===

impl Target {
    /// Parse and check the first hop's URL.
    pub(crate) fn parse(url: &str, policy: &FetchPolicy) -> Result<Self, FetchError> {
        if url.len() > MAX_URL_LEN {
            return Err(FetchError::InvalidUrl {
                reason: format!("longer than {MAX_URL_LEN} characters"),
            });
        }
        let url = Url::parse(url).map_err(|e| FetchError::InvalidUrl {
            reason: e.to_string(),
        })?;
        Self::check(url, policy)
    }

    /// The next hop: `location` resolved against this one, checked from scratch.
    pub(crate) fn redirect(
        &self,
        location: &str,
        policy: &FetchPolicy,
    ) -> Result<Self, FetchError> {
        if location.len() > MAX_URL_LEN {
            return Err(FetchError::Redirect {
                reason: format!("Location longer than {MAX_URL_LEN} characters"),
            });
        }
        let url = self.url.join(location).map_err(|e| FetchError::Redirect {
            reason: format!("Location `{location}`: {e}"),
        })?;
        Self::check(url, policy)
    }

    fn check(url: Url, policy: &FetchPolicy) -> Result<Self, FetchError> {
        let https = match url.scheme() {
            "https" => true,
            "http" if policy.allow_http => false,
            scheme => {
                return Err(FetchError::Scheme {
                    scheme: scheme.into(),
                    allowed: if policy.allow_http {
                        "http(s)"
                    } else {
                        "https"
                    },
                })
            }
        };
        if !url.username().is_empty() || url.password().is_some() {
            return Err(FetchError::Credentials);
        }
        let host = match url.host() {
            Some(Host::Domain(name)) => TargetHost::Name(name.to_owned()),
            Some(Host::Ipv4(ip)) => TargetHost::Ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => TargetHost::Ip(IpAddr::V6(ip)),
            None => {
                return Err(FetchError::InvalidUrl {
                    reason: "no host".into(),
                })
            }
        };
        let port = url
            .port_or_known_default()
            .ok_or_else(|| FetchError::InvalidUrl {
                reason: "no port".into(),
            })?;
        Ok(Self {
            url,
            https,
            host,
            port,
        })
    }

    /// The host as the URL names it (bracketed for IPv6), for messages.
    pub(crate) fn host_str(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// The `Host` header: the host, and the port when it is not the scheme's default.
    pub(crate) fn authority(&self) -> String {
        match self.url.port() {
            Some(port) => format!("{}:{port}", self.host_str()),
            None => self.host_str().to_owned(),
        }
    }

    /// The request target: path and query, never the fragment.
    pub(crate) fn path_and_query(&self) -> String {
        match self.url.query() {
            Some(query) => format!("{}?{query}", self.url.path()),
            None => self.url.path().to_owned(),
        }
    }
}
