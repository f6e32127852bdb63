//! `[limits]`: where tenant rate and concurrency counters live (and, with Redis, everything
//! else the replicas share: rollout decisions, prefix indexes, response owners).
//!
//! Redis is named one way per topology, exactly one of:
//! - `redis_url = "redis://host:6379/0"` — one node (or `unix:///path/redis.sock`);
//! - `redis_cluster = ["redis://a:6379", "redis://b:6379", …]` — seed nodes of a Redis
//!   Cluster (the client learns the rest and follows MOVED/ASK);
//! - `[limits.redis_sentinel]` — `sentinels = [...]` and the `primary_name` they monitor
//!   (the client asks them for the primary, and again after a failover).
//!
//! TLS: `rediss://` addresses (and `primary_tls = true` for the primary a sentinel names);
//! `redis_tls` adds a private CA and a client certificate to all of them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::files::resolve;
use super::invalid::Invalid;

/// `[limits]`: where tenant rate and concurrency counters live.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// `memory` (this gateway alone) or `redis` (shared by every replica).
    pub backend: LimitsBackend,
    /// For `redis`, one node: `redis://host:6379/0` or `unix:///path/redis.sock`.
    pub redis_url: Option<String>,
    /// For `redis`, a Redis Cluster: seed nodes (`redis://host:port`, at least one; list
    /// several so a start does not depend on one node).
    pub redis_cluster: Option<Vec<String>>,
    /// For `redis`, a Sentinel-managed primary.
    pub redis_sentinel: Option<SentinelConfig>,
    /// For `redis` over TLS: the CA that signs the servers' certificates (default: the
    /// system's roots) and kvgate's client certificate (`tls-auth-clients yes`). Read at
    /// start only (`[limits]` applies at start).
    pub redis_tls: Option<RedisTlsConfig>,
    /// Key prefix in Redis (several deployments can share one Redis).
    pub key_prefix: String,
    /// When Redis cannot be reached: `fail_open` (serve, unlimited) or `fail_closed` (429).
    pub failure_policy: LimitsFailurePolicy,
}

/// `[limits.redis_sentinel]`: a primary found through Redis Sentinel.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The sentinels, `redis://host:26379` (a `user:password@` in a URL is the sentinel's
    /// own auth).
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under (`sentinel monitor <name> …`).
    pub primary_name: String,
    /// The primary's ACL user, if it has one.
    #[serde(default)]
    pub username: Option<String>,
    /// The primary's password (`requirepass` / the ACL user's), if it has one.
    #[serde(default)]
    pub password: Option<String>,
    /// The database number on the primary.
    #[serde(default)]
    pub db: i64,
    /// Whether the primary (and the replica promoted in its place) speaks TLS: the
    /// sentinels name an address, not a scheme. TLS to the sentinels themselves is their
    /// `rediss://` URLs.
    #[serde(default)]
    pub primary_tls: bool,
}

/// `[limits] redis_tls`: the files of TLS to Redis, for every `rediss://` connection
/// (nodes, cluster nodes, sentinels, the primary with `primary_tls`).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedisTlsConfig {
    /// PEM bundle of the CAs that sign the Redis servers' certificates; only these are
    /// trusted. Without it, the system's roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain kvgate presents (Redis `tls-auth-clients yes`); needs
    /// `key_file`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The password never reaches a log line.
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels.len())
            .field("primary_name", &self.primary_name)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("db", &self.db)
            .field("primary_tls", &self.primary_tls)
            .finish()
    }
}

/// Which Redis the replicas share, as `[limits]` names it, and the TLS files for it (data
/// only: the client is built from it by `crate::redis_link`).
#[derive(Debug, Clone, PartialEq)]
pub struct RedisTarget {
    /// The servers.
    pub servers: RedisServers,
    /// `redis_tls`, if set (only with TLS addresses: checked at load).
    pub tls: Option<RedisTlsConfig>,
}

impl RedisTarget {
    /// One node at `url`, without TLS files (`rediss://` still uses the system's roots).
    pub fn node(url: impl Into<String>) -> Self {
        Self {
            servers: RedisServers::Node(url.into()),
            tls: None,
        }
    }
}

/// The Redis servers of a [`RedisTarget`], one topology.
#[derive(Debug, Clone, PartialEq)]
pub enum RedisServers {
    /// One node (`redis_url`).
    Node(String),
    /// A Redis Cluster, by seed nodes (`redis_cluster`).
    Cluster(Vec<String>),
    /// A Sentinel-managed primary (`[limits.redis_sentinel]`).
    Sentinel(SentinelConfig),
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            backend: LimitsBackend::Memory,
            redis_url: None,
            redis_cluster: None,
            redis_sentinel: None,
            redis_tls: None,
            key_prefix: "kvgate".into(),
            failure_policy: LimitsFailurePolicy::FailOpen,
        }
    }
}

const ONE_OF: &str =
    "set exactly one of redis_url (one node), redis_cluster (a Redis Cluster's seed nodes) or [limits.redis_sentinel] (sentinels and primary_name)";

impl LimitsConfig {
    /// The Redis the replicas share: `Some` when `backend = "redis"` (checked at load to
    /// name exactly one topology).
    pub fn redis(&self) -> Option<RedisTarget> {
        if self.backend != LimitsBackend::Redis {
            return None;
        }
        let servers = if let Some(url) = &self.redis_url {
            RedisServers::Node(url.clone())
        } else if let Some(nodes) = &self.redis_cluster {
            RedisServers::Cluster(nodes.clone())
        } else {
            RedisServers::Sentinel(self.redis_sentinel.clone()?)
        };
        Some(RedisTarget {
            servers,
            tls: self.redis_tls.clone(),
        })
    }

    /// Whether the Redis `[limits]` names is reached over TLS anywhere.
    fn uses_tls(&self) -> bool {
        let tls = |url: &String| is_tls(url);
        self.redis_url.iter().any(tls)
            || self.redis_cluster.iter().flatten().any(tls)
            || self
                .redis_sentinel
                .as_ref()
                .is_some_and(|s| s.primary_tls || s.sentinels.iter().any(tls))
    }

    /// The rules of `[limits]`; `redis_tls` files are resolved against `base`.
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        let given: Vec<&str> = [
            self.redis_url.as_ref().map(|_| "limits.redis_url"),
            self.redis_cluster.as_ref().map(|_| "limits.redis_cluster"),
            self.redis_sentinel
                .as_ref()
                .map(|_| "limits.redis_sentinel"),
        ]
        .into_iter()
        .flatten()
        .collect();
        match (self.backend, given.as_slice()) {
            (LimitsBackend::Redis, []) => {
                return Err(Invalid::new(
                    "limits.redis_url",
                    format!("backend = \"redis\" needs a Redis: {ONE_OF}, e.g. redis_url = \"redis://10.0.0.9:6379/0\""),
                ))
            }
            (LimitsBackend::Redis, [_, second, ..]) => {
                return Err(Invalid::new(*second, format!("{}: {ONE_OF}", given.join(" and ") + " are both set")));
            }
            (LimitsBackend::Memory, [key, ..]) if *key != "limits.redis_url" => {
                // (A redis_url under memory predates this rule and stays accepted.)
                return Err(Invalid::new(
                    *key,
                    "only used with backend = \"redis\": set backend = \"redis\", or remove it",
                ));
            }
            _ => {}
        }
        if self.key_prefix.contains(['{', '}']) {
            // A brace would start a Redis Cluster hash tag of its own, so one tenant's keys
            // could land in different slots and its scripts fail with CROSSSLOT.
            return Err(Invalid::new(
                "limits.key_prefix",
                "must not contain `{` or `}` (kvgate puts each tenant in a hash tag of its own), e.g. \"kvgate\"",
            ));
        }
        if let Some(url) = &self.redis_url {
            redis_url("limits.redis_url", url, true)?;
        }
        if let Some(nodes) = &self.redis_cluster {
            if nodes.is_empty() {
                return Err(Invalid::new(
                    "limits.redis_cluster",
                    "needs at least one seed node, e.g. [\"redis://10.0.0.11:6379\", \"redis://10.0.0.12:6379\"]",
                ));
            }
            for (i, url) in nodes.iter().enumerate() {
                redis_url(&format!("limits.redis_cluster[{i}]"), url, false)?;
            }
            same_scheme("limits.redis_cluster", nodes)?;
        }
        if let Some(s) = &self.redis_sentinel {
            if s.sentinels.is_empty() {
                return Err(Invalid::new(
                    "limits.redis_sentinel.sentinels",
                    "needs at least one sentinel (three for a quorum), e.g. [\"redis://10.0.0.21:26379\"]",
                ));
            }
            for (i, url) in s.sentinels.iter().enumerate() {
                redis_url(&format!("limits.redis_sentinel.sentinels[{i}]"), url, false)?;
            }
            same_scheme("limits.redis_sentinel.sentinels", &s.sentinels)?;
            same_credentials(&s.sentinels)?;
            if s.primary_name.trim().is_empty() {
                return Err(Invalid::new(
                    "limits.redis_sentinel.primary_name",
                    "must name the primary as the sentinels monitor it (`sentinel monitor <name> ...`)",
                ));
            }
            if s.db < 0 {
                return Err(Invalid::new(
                    "limits.redis_sentinel.db",
                    "must be a database number, 0 or more",
                ));
            }
        }
        self.check_tls(base)
    }

    /// `redis_tls`: files that exist, a client certificate with its key, and some address
    /// that uses TLS (the files would otherwise be ignored without a word).
    fn check_tls(&mut self, base: &Path) -> Result<(), Invalid> {
        let uses_tls = self.uses_tls();
        let Some(tls) = self.redis_tls.as_mut() else {
            return Ok(());
        };
        if !uses_tls {
            return Err(Invalid::new(
                "limits.redis_tls",
                "is only used with TLS to Redis, and no Redis address uses it: write rediss:// in redis_url, redis_cluster or redis_sentinel.sentinels (and primary_tls = true for a primary that speaks TLS), or remove redis_tls",
            ));
        }
        for (key, file) in [
            ("limits.redis_tls.ca_file", &mut tls.ca_file),
            ("limits.redis_tls.cert_file", &mut tls.cert_file),
            ("limits.redis_tls.key_file", &mut tls.key_file),
        ] {
            if let Some(f) = file.as_mut() {
                resolve(base, f, key)?;
            }
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => Err(Invalid::new(
                "limits.redis_tls.key_file",
                "a client certificate (cert_file) needs its private key: key_file = \"...\"",
            )),
            (None, Some(_)) => Err(Invalid::new(
                "limits.redis_tls.cert_file",
                "a client key (key_file) needs its certificate chain: cert_file = \"...\"",
            )),
            _ => Ok(()),
        }
    }
}

impl LimitsConfig {
    /// With Redis, each tenant's keys share the hash tag `{<tenant>}` (a Redis Cluster puts
    /// them in one slot, as a script over several of them requires); a brace in the name
    /// would cut the tag short, or leave it empty and split the tenant across slots.
    pub(super) fn check_tenant_names(
        &self,
        tenants: &[super::tenants::TenantConfig],
    ) -> Result<(), Invalid> {
        if self.backend != LimitsBackend::Redis {
            return Ok(());
        }
        match tenants.iter().position(|t| t.name.contains(['{', '}'])) {
            Some(i) => Err(Invalid::new(
                format!("tenants[{i}].name"),
                "must not contain `{` or `}` with [limits] backend = \"redis\" (the name is the tenant's Redis Cluster hash tag)",
            )),
            None => Ok(()),
        }
    }
}

/// A Redis URL's scheme and host (the rest is checked by the client at start). The URL is
/// never echoed: it may hold a password.
fn redis_url(key: &str, url: &str, unix_ok: bool) -> Result<(), Invalid> {
    if unix_ok && url.starts_with("unix://") {
        return Ok(());
    }
    let host = url
        .strip_prefix("redis://")
        .or_else(|| url.strip_prefix("rediss://"))
        .map(|rest| rest.rsplit('@').next().unwrap_or(rest))
        .unwrap_or("");
    if host.is_empty() || host.starts_with(['/', ':']) {
        let example = if unix_ok {
            "\"redis://host:6379/0\", \"rediss://host:6379/0\" (TLS) or \"unix:///path/redis.sock\""
        } else {
            "\"redis://host:6379\" or \"rediss://host:6379\" (TCP: these nodes announce TCP addresses to each other)"
        };
        return Err(Invalid::new(
            key,
            format!("must be a Redis URL, e.g. {example}"),
        ));
    }
    Ok(())
}

/// Whether a Redis URL asks for TLS (`rediss://`).
pub fn is_tls(url: &str) -> bool {
    url.starts_with("rediss://")
}

/// Every URL of a list with the scheme of the first: the client speaks TLS to all of a
/// cluster's nodes (or all sentinels) or to none, and would refuse a mix at start.
fn same_scheme(key: &str, urls: &[String]) -> Result<(), Invalid> {
    let tls = |u: &String| is_tls(u);
    match urls.iter().position(|u| tls(u) != urls.first().is_some_and(tls)) {
        Some(i) => Err(Invalid::new(
            format!("{key}[{i}]"),
            "mixes redis:// and rediss:// in one list: use rediss:// for all of them (TLS) or for none",
        )),
        None => Ok(()),
    }
}

/// The `user:password@` of a URL (empty without one).
fn credentials(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.rsplit_once('@').map_or("", |(creds, _)| creds)
}

/// Every sentinel with the same `user:password@`: the client sends one set of sentinel
/// credentials to all of them (it takes them from the first URL).
fn same_credentials(sentinels: &[String]) -> Result<(), Invalid> {
    let first = sentinels.first().map_or("", |u| credentials(u));
    match sentinels.iter().position(|u| credentials(u) != first) {
        Some(i) => Err(Invalid::new(
            format!("limits.redis_sentinel.sentinels[{i}]"),
            "carries other credentials than sentinels[0]: kvgate sends one sentinel user and password to every sentinel, so give every URL the same user:password@ (or none)",
        )),
        None => Ok(()),
    }
}

/// Where limit counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsBackend {
    Memory,
    Redis,
}

/// What to do when the limit store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsFailurePolicy {
    FailOpen,
    FailClosed,
}
