//! What a replica shares through the Redis `[limits]` names — tenant limits, rollout
//! decisions, prefix indexes, response owners — each built here from the one
//! [`RedisTarget`] (a node, a Redis Cluster or a Sentinel-managed primary), so all four
//! follow the same topology. Passwords never reach a log line or an error.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, LimitsConfig, LimitsFailurePolicy, RedisServers, RedisTarget};
use crate::fleet::PrefixShare;
use crate::redis_link::RedisLink;
use crate::rollout::SharedDecisions;
use crate::runtime::process::redact::{redact_in, redact_url};
use crate::runtime::StartError;
use crate::stack::rate_limit::limiter::{
    FailurePolicy, GuardedStore, Limiter, RedisOptions, RedisStore,
};
use crate::stack::responses::ResponseOwners;

/// Stored responses kept in memory at most, and how long an owner is remembered.
const RESPONSE_OWNERS: usize = 100_000;
const RESPONSE_OWNER_TTL: Duration = Duration::from_secs(24 * 3600);
/// Each Redis operation of the owner map is bounded by this.
const RESPONSE_OWNERS_REDIS_TIMEOUT: Duration = Duration::from_millis(500);

/// `target` for a log line: its addresses, passwords redacted.
pub fn describe(target: &RedisTarget) -> String {
    match &target.servers {
        RedisServers::Node(url) => redact_url(url),
        RedisServers::Cluster(nodes) => format!(
            "cluster [{}]",
            nodes
                .iter()
                .map(|n| redact_url(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        RedisServers::Sentinel(s) => format!(
            "primary `{}`{} of sentinels [{}]",
            s.primary_name,
            if s.primary_tls { " (TLS)" } else { "" },
            s.sentinels
                .iter()
                .map(|n| redact_url(n))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `text` (a client error) with every password `target` holds replaced.
pub fn redact_target_in(text: &str, target: &RedisTarget) -> String {
    match &target.servers {
        RedisServers::Node(url) => redact_in(text, url),
        RedisServers::Cluster(nodes) => nodes.iter().fold(text.to_owned(), |t, n| redact_in(&t, n)),
        RedisServers::Sentinel(s) => {
            let mut out = s
                .sentinels
                .iter()
                .fold(text.to_owned(), |t, n| redact_in(&t, n));
            if let Some(p) = s.password.as_deref().filter(|p| !p.is_empty()) {
                out = out.replace(p, "***");
            }
            out
        }
    }
}

/// The key a topology is configured under, for errors.
fn key(target: &RedisTarget) -> &'static str {
    match &target.servers {
        RedisServers::Node(_) => "limits.redis_url",
        RedisServers::Cluster(_) => "limits.redis_cluster",
        RedisServers::Sentinel(_) => "limits.redis_sentinel",
    }
}

/// The Redis limit store when `[limits] backend = "redis"`. A Redis that is down does not
/// stop the gateway: it serves by the failure policy and the store connects in the
/// background. Only an unusable address is fatal.
pub async fn limiter(limits: &LimitsConfig) -> Result<Option<Limiter>, StartError> {
    let Some(target) = limits.redis() else {
        return Ok(None);
    };
    let (store, first_error) =
        RedisStore::start_target(&target, &limits.key_prefix, RedisOptions::default())
            .await
            .map_err(|e| {
                StartError::Limits(format!(
                    "cannot use Redis at {} ({}): {}",
                    describe(&target),
                    key(&target),
                    redact_target_in(&e.to_string(), &target)
                ))
            })?;
    let connected = first_error.is_none();
    if let Some(e) = first_error {
        tracing::warn!(
            redis = %describe(&target),
            error = %redact_target_in(&e.to_string(), &target),
            policy = ?limits.failure_policy,
            "Redis does not answer: starting anyway, limited tenants are served by limits.failure_policy until it does (connecting in the background)"
        );
    }
    let policy = match limits.failure_policy {
        LimitsFailurePolicy::FailOpen => FailurePolicy::FailOpen,
        LimitsFailurePolicy::FailClosed => FailurePolicy::FailClosed,
    };
    Ok(Some(Limiter::new(GuardedStore::starting(
        store, policy, connected,
    ))))
}

/// Where prefix indexes are shared: the limits' Redis, when `[limits]` uses one (the loop
/// asks the config in force whether to share at all).
pub fn prefix_share(limits: &LimitsConfig, replica: Arc<str>) -> Option<Arc<PrefixShare>> {
    let target = limits.redis()?;
    match PrefixShare::new(&target, &limits.key_prefix, replica) {
        Ok(share) => Some(Arc::new(share)),
        Err(e) => {
            tracing::warn!(error = %redact_target_in(&e.to_string(), &target), "prefix indexes stay per replica: the Redis address is unusable");
            None
        }
    }
}

/// Where rollout decisions are shared: the limits' Redis, when `[limits]` uses one (also
/// without rollouts: a reload may add one, and Redis is asked only when there is).
pub fn shared_decisions(limits: &LimitsConfig) -> Option<Arc<SharedDecisions>> {
    let target = limits.redis()?;
    match SharedDecisions::new(&target, &limits.key_prefix) {
        Ok(shared) => Some(Arc::new(shared)),
        Err(e) => {
            tracing::warn!(error = %redact_target_in(&e.to_string(), &target), "rollout decisions stay per replica: the Redis address is unusable");
            None
        }
    }
}

/// The owner map of stored responses: shared through the limits' Redis when `[limits]`
/// uses one, so a continuation reaching another replica is checked too.
pub fn response_owners(config: &Config) -> ResponseOwners {
    let limits = &config.limits;
    let redis = limits.redis().and_then(|target| {
        match RedisLink::open(&target, RESPONSE_OWNERS_REDIS_TIMEOUT, "responses") {
            Ok(link) => Some(Arc::new(link)),
            Err(e) => {
                tracing::warn!(error = %redact_target_in(&e.to_string(), &target), "stored responses stay per replica: the Redis address is unusable");
                None
            }
        }
    });
    ResponseOwners::new(RESPONSE_OWNERS, RESPONSE_OWNER_TTL, redis)
        .with_key_prefix(&limits.key_prefix)
}
