//! `[discovery]`: how the names of `discover = "dns"` / `"srv"` worker entries are resolved
//! (issue 39): how often, how long one lookup may take, and which name servers answer.

use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

use super::invalid::{self, Invalid};

/// The shortest re-resolution interval: a lookup round per second is already more than a
/// cluster DNS needs to see from each replica.
const SHORTEST_INTERVAL: Duration = Duration::from_millis(100);

/// `[discovery]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Time between two resolutions of every discovered name.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long one lookup may take (a slower answer is a failed one: the last answer is kept).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Name servers to ask, `ip` or `ip:port` (default: the system's, from /etc/resolv.conf).
    pub dns_servers: Vec<String>,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            dns_servers: Vec::new(),
        }
    }
}

impl DiscoveryConfig {
    /// The rules of `[discovery]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        invalid::deadline("discovery.interval", self.interval)?;
        invalid::deadline("discovery.timeout", self.timeout)?;
        if self.interval < SHORTEST_INTERVAL {
            return Err(Invalid::new(
                "discovery.interval",
                "must be at least 100ms, e.g. \"5s\"",
            ));
        }
        for (i, server) in self.dns_servers.iter().enumerate() {
            if parse_server(server).is_none() {
                return Err(Invalid::new(
                    format!("discovery.dns_servers[{i}]"),
                    format!("`{server}` is not an address: write \"10.96.0.10\" or \"127.0.0.1:5353\" ([::1]:53 for IPv6)"),
                ));
            }
        }
        Ok(())
    }

    /// The configured name servers (port 53 where none is written); empty: the system's.
    pub fn servers(&self) -> Vec<SocketAddr> {
        self.dns_servers
            .iter()
            .filter_map(|s| parse_server(s))
            .collect()
    }
}

/// `ip:port`, or an `ip` alone on port 53.
fn parse_server(text: &str) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| {
        text.parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}
