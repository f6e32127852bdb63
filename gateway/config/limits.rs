//! `[limits]`: where tenant rate and concurrency counters live (and, with Redis, everything
//! else the replicas share: rollout decisions, prefix indexes, response owners).
//!
//! Redis is named one way per topology, exactly one of:
//! - `redis_url = "redis://host:6379/0"` — one node (or `unix:///path/redis.sock`);
//! - `redis_cluster = ["redis://a:6379", "redis://b:6379", …]` — seed nodes of a Redis
//!   Cluster (the client learns the rest and follows MOVED/ASK);
//! - `[limits.redis_sentinel]` — `sentinels = [...]` and the `primary_name` they monitor
//!   (the client asks them for the primary, and again after a failover).

use serde::Deserialize;

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
            .finish()
    }
}

/// Which Redis the replicas share, as `[limits]` names it (data only: the client is built
/// from it by `crate::redis_link`).
#[derive(Debug, Clone, PartialEq)]
pub enum RedisTarget {
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
        if let Some(url) = &self.redis_url {
            return Some(RedisTarget::Node(url.clone()));
        }
        if let Some(nodes) = &self.redis_cluster {
            return Some(RedisTarget::Cluster(nodes.clone()));
        }
        self.redis_sentinel.clone().map(RedisTarget::Sentinel)
    }

    /// The rules of `[limits]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
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
        Ok(())
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
    if url.starts_with("rediss://") {
        return Err(Invalid::new(
            key,
            "TLS to Redis (rediss://) is not built into kvgate: use redis:// on a private network, or a TLS proxy beside kvgate",
        ));
    }
    if unix_ok && url.starts_with("unix://") {
        return Ok(());
    }
    let host = url
        .strip_prefix("redis://")
        .map(|rest| rest.rsplit('@').next().unwrap_or(rest))
        .unwrap_or("");
    if host.is_empty() || host.starts_with(['/', ':']) {
        let example = if unix_ok {
            "\"redis://host:6379/0\" or \"unix:///path/redis.sock\""
        } else {
            "\"redis://host:6379\" (TCP: these nodes announce TCP addresses to each other)"
        };
        return Err(Invalid::new(
            key,
            format!("must be a Redis URL, e.g. {example}"),
        ));
    }
    Ok(())
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
