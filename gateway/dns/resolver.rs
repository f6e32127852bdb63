//! DNS lookups of discovered worker names (hickory's stub resolver on tokio): A/AAAA of a
//! `discover = "dns"` host, SRV of a `discover = "srv"` host and of a `bootstrap_srv`
//! name, each SRV target then resolved to its address.

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts};
use hickory_resolver::name_server::TokioConnectionProvider;
use hickory_resolver::proto::rr::rdata::SRV;
use hickory_resolver::{ResolveError, TokioResolver};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::{Discover, DiscoveryConfig};
use crate::fleet::Endpoint;

/// Why a name gave no usable answer (the last good one is then kept).
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LookupError {
    /// The system's resolver configuration could not be read.
    #[error(
        "no name server to ask: /etc/resolv.conf unreadable ({0}); set [discovery] dns_servers"
    )]
    NoSystemConfig(String),
    #[error("{name}: no such name (NXDOMAIN)")]
    NoSuchName { name: String },
    #[error("{name}: no answer within {after:?}")]
    Timeout { name: String, after: Duration },
    #[error("{name}: {reason}")]
    Failed { name: String, reason: String },
    /// An SRV target of the answer did not resolve: the answer is used whole or not at all.
    #[error("{name}: SRV target {target} did not resolve: {reason}")]
    Target {
        name: String,
        target: String,
        reason: String,
    },
}

/// A resolver over the configured (or the system's) name servers, without a cache of its
/// own that would outlive the records' TTL between two rounds.
#[derive(Debug, Clone)]
pub struct DnsResolver {
    inner: TokioResolver,
    timeout: Duration,
}

impl DnsResolver {
    /// The resolver `[discovery]` describes.
    pub fn new(config: &DiscoveryConfig) -> Result<Self, LookupError> {
        let servers = config.servers();
        let mut builder = if servers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| LookupError::NoSystemConfig(e.to_string()))?
        } else {
            let mut group = NameServerConfigGroup::new();
            for server in servers {
                // UDP, and TCP for an answer too large for one datagram (many pods).
                group.merge(NameServerConfigGroup::from_ips_clear(
                    &[server.ip()],
                    server.port(),
                    true,
                ));
            }
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), group),
                TokioConnectionProvider::default(),
            )
        };
        let options: &mut ResolverOpts = builder.options_mut();
        options.timeout = config.timeout;
        // One try per round: the next round is the retry, and a round must not outlast it.
        options.attempts = 1;
        Ok(Self {
            inner: builder.build(),
            timeout: config.timeout,
        })
    }

    /// Start a round: answers are asked afresh (cached ones may hide a change for their TTL).
    pub fn clear_cache(&self) {
        self.inner.clear_cache();
    }

    /// The engines `name` lists: every address at `port` (`Dns`), or every SRV target and
    /// port (`Srv`); with `bootstrap_srv`, each address's KV bootstrap port from it.
    /// `Ok(empty)`: the name exists and lists nothing.
    pub async fn endpoints(
        &self,
        kind: Discover,
        name: &str,
        port: u16,
        bootstrap_srv: Option<&str>,
    ) -> Result<Vec<Endpoint>, LookupError> {
        let addrs = match kind {
            Discover::Dns => self
                .addresses(name)
                .await?
                .into_iter()
                .map(|ip| SocketAddr::new(ip, port))
                .collect(),
            Discover::Srv => self.srv(name).await?,
        };
        let bootstrap: BTreeMap<IpAddr, u16> = match bootstrap_srv {
            Some(srv) => self
                .srv(srv)
                .await?
                .into_iter()
                .map(|a| (a.ip(), a.port()))
                .collect(),
            None => BTreeMap::new(),
        };
        Ok(addrs
            .into_iter()
            .map(|addr: SocketAddr| Endpoint {
                addr,
                bootstrap_port: bootstrap.get(&addr.ip()).copied(),
            })
            .collect())
    }

    /// The addresses of `name` (IPv4 if it has any, else IPv6).
    async fn addresses(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        match self.bounded(name, self.inner.lookup_ip(name)).await? {
            Some(answer) => Ok(answer.iter().collect()),
            None => Ok(Vec::new()),
        }
    }

    /// Every SRV target of `name` at its port, targets resolved to addresses.
    async fn srv(&self, name: &str) -> Result<Vec<SocketAddr>, LookupError> {
        let Some(answer) = self.bounded(name, self.inner.srv_lookup(name)).await? else {
            return Ok(Vec::new());
        };
        let records: Vec<SRV> = answer.iter().cloned().collect();
        let mut found = Vec::new();
        for record in records {
            let target = record.target().to_utf8();
            let ips = self
                .addresses(&target)
                .await
                .map_err(|e| LookupError::Target {
                    name: name.to_owned(),
                    target: target.clone(),
                    reason: e.to_string(),
                })?;
            found.extend(ips.into_iter().map(|ip| SocketAddr::new(ip, record.port())));
        }
        Ok(found)
    }

    /// One lookup within the timeout; `None`: the name exists and has no record of the type.
    async fn bounded<T>(
        &self,
        name: &str,
        lookup: impl std::future::Future<Output = Result<T, ResolveError>>,
    ) -> Result<Option<T>, LookupError> {
        // The resolver's own timeout bounds each query; this bounds the whole lookup.
        match tokio::time::timeout(self.timeout * 2, lookup).await {
            Err(_) => Err(LookupError::Timeout {
                name: name.to_owned(),
                after: self.timeout,
            }),
            Ok(Ok(answer)) => Ok(Some(answer)),
            Ok(Err(e)) if e.is_nx_domain() => Err(LookupError::NoSuchName {
                name: name.to_owned(),
            }),
            Ok(Err(e)) if e.is_no_records_found() => Ok(None),
            Ok(Err(e)) => Err(LookupError::Failed {
                name: name.to_owned(),
                reason: e.to_string(),
            }),
        }
    }
}
