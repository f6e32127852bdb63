//! What this replica is called among the others, and the stored responses' owner map it
//! shares with them through the limits' Redis.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{Config, LimitsBackend};
use crate::redis_link::RedisLink;
use crate::runtime::process::redact::redact_in;
use crate::stack::responses::ResponseOwners;

/// Stored responses kept in memory at most, and how long an owner is remembered.
const RESPONSE_OWNERS: usize = 100_000;
const RESPONSE_OWNER_TTL: Duration = Duration::from_secs(24 * 3600);
/// Each Redis operation of the owner map is bounded by this.
const RESPONSE_OWNERS_REDIS_TIMEOUT: Duration = Duration::from_millis(500);

/// The owner map of stored responses: shared through the limits' Redis when `[limits]`
/// uses one, so a continuation reaching another replica is checked too.
pub(crate) fn response_owners(config: &Config) -> ResponseOwners {
    let limits = &config.limits;
    let redis = (limits.backend == LimitsBackend::Redis)
        .then_some(limits.redis_url.as_deref())
        .flatten()
        .and_then(|url| match RedisLink::open(url, RESPONSE_OWNERS_REDIS_TIMEOUT) {
            Ok(link) => Some(Arc::new(link)),
            Err(e) => {
                tracing::warn!(error = %redact_in(&e.to_string(), url), "stored responses stay per replica: the Redis URL is unusable");
                None
            }
        });
    ResponseOwners::new(RESPONSE_OWNERS, RESPONSE_OWNER_TTL, redis)
        .with_key_prefix(&limits.key_prefix)
}

/// This replica's name in shared decisions and audit lines: the host name (a pod's name
/// in Kubernetes) and a random suffix, so two processes on one host differ.
pub(crate) fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "kvgate".to_owned());
    format!("{host}-{:04x}", crate::secure_random::u64() & 0xffff)
}
