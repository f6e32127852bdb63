//! Rollout decisions shared between replicas through Redis.
//!
//! Each replica decides from its own traffic; when `[limits]` uses Redis, a replica also
//! publishes each change of a rollout (`{prefix}:rollout:{model}`, JSON, kept seven days)
//! and reads the others' once a second, so one replica's rollback holds for all, and for
//! a replica started later. Decisions are ordered by epoch: a write lands only when it is
//! newer than what Redis holds (one Lua script, so two replicas cannot interleave); the
//! loser of a race adopts the stored decision. A replica that applies a decision does to
//! its own windows what the deciding replica did to its: a decision carries the epoch of
//! the last `clear` (`window_epoch`), and a newer one makes the adopting replica forget its
//! canary window too (even when a later decision superseded the clear before it looked).
//!
//! A replica that cannot reach Redis (at start or later) keeps serving and keeps deciding
//! from its own traffic; it publishes what it decided meanwhile once Redis answers again,
//! and until then it does not see the others' decisions. `kvgate_rollout_shared_ok` says
//! which it is.

use redis::Script;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Decision, Rollouts};
use crate::config::RedisTarget;
use crate::metrics;
use crate::redis_link::{RedisLink, SharedConnection};
use crate::runtime::listener::server::Shutdown;

const PUBLISH: &str = r#"
local current = redis.call('GET', KEYS[1])
if current then
  local ok, stored = pcall(cjson.decode, current)
  if ok and type(stored) == 'table' and tonumber(stored.epoch) and tonumber(stored.epoch) >= tonumber(ARGV[1]) then
    return current
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
"#;

/// How long a shared decision is kept after its last change.
const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// One Redis operation, connecting included.
const OP_TIMEOUT: Duration = Duration::from_millis(500);
/// How often decisions are evaluated, published and read.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// The Redis side of rollout decisions.
pub struct SharedDecisions {
    redis: RedisLink,
    prefix: String,
    publish: Script,
}

impl std::fmt::Debug for SharedDecisions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedDecisions")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl SharedDecisions {
    /// Decisions under `prefix` in the Redis `target` names (connected on first use, so a
    /// Redis that is down at start only delays sharing).
    pub fn new(target: &RedisTarget, prefix: &str) -> Result<Self, redis::RedisError> {
        Ok(Self {
            redis: RedisLink::open(target, OP_TIMEOUT, "rollout")?,
            prefix: prefix.to_owned(),
            publish: Script::new(PUBLISH),
        })
    }

    fn key(&self, model: &str) -> String {
        format!("{}:rollout:{model}", self.prefix)
    }

    async fn connection(&self) -> Result<SharedConnection, String> {
        self.redis.connection().await
    }

    /// Publish this replica's unpublished decisions, then adopt newer ones from Redis.
    pub async fn sync(&self, rollouts: &Rollouts) -> Result<(), String> {
        let mut conn = self.connection().await?;
        for rollout in rollouts.all() {
            let key = self.key(&rollout.config.model);
            if let Some(mine) = rollout.unpublished() {
                let json = serde_json::to_string(&mine).map_err(|e| e.to_string())?;
                let mut invocation = self.publish.key(&key);
                invocation
                    .arg(mine.epoch)
                    .arg(json)
                    .arg(KEEP.as_millis() as u64);
                let stored: Option<String> = self
                    .redis
                    .bounded(invocation.invoke_async(&mut conn))
                    .await?;
                rollout.published(mine.epoch);
                if let Some(theirs) = stored.and_then(|s| serde_json::from_str::<Decision>(&s).ok())
                {
                    // Lost a race (or Redis held a newer decision): theirs stands.
                    rollout.adopt(theirs);
                }
                continue;
            }
            let stored: Option<String> = self
                .redis
                .bounded(redis::cmd("GET").arg(&key).query_async(&mut conn))
                .await?;
            match stored.map(|s| serde_json::from_str::<Decision>(&s)) {
                Some(Ok(theirs)) => {
                    rollout.apply_shared(theirs);
                }
                Some(Err(e)) => {
                    tracing::warn!(%key, error = %e, "ignoring an unreadable shared rollout decision")
                }
                None => {}
            }
        }
        Ok(())
    }
}

/// Once a second: evaluate every rollout (promotions need time to pass), then publish and
/// read shared decisions when Redis is configured. `current` gives the rollouts of the
/// config in force at each round (a reload may replace them).
pub async fn sync_loop(
    current: impl Fn() -> Arc<Rollouts>,
    shared: Option<Arc<SharedDecisions>>,
    mut shutdown: Shutdown,
) {
    let mut reachable: Option<bool> = None;
    loop {
        let rollouts = current();
        rollouts.evaluate(Instant::now());
        // Nothing to share while no rollout is configured: Redis is not asked.
        if let Some(shared) = shared.as_ref().filter(|_| !rollouts.all().is_empty()) {
            let result = shared.sync(&rollouts).await;
            let ok = result.is_ok();
            if reachable != Some(ok) {
                match &result {
                    Ok(()) => tracing::info!("shared rollout decisions: Redis reachable"),
                    Err(e) => {
                        tracing::warn!(error = %e, "shared rollout decisions: Redis unreachable; deciding from this replica's traffic alone until it answers")
                    }
                }
                reachable = Some(ok);
            }
            ::metrics::gauge!(metrics::ROLLOUT_SHARED_OK).set(if ok { 1.0 } else { 0.0 });
        }
        tokio::select! {
            _ = tokio::time::sleep(SYNC_INTERVAL) => {}
            _ = shutdown.wait() => return,
        }
    }
}
