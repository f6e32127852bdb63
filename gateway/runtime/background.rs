//! The gateway's background loops on the main runtime: capacity discovery, active health
//! checks, the sweeps that give back memory and the status page's activity buckets.

use std::sync::Arc;
use std::time::Duration;

use crate::activity::{Activity, BUCKET};
use crate::config::HealthConfig;
use crate::runtime::server::Shutdown;
use crate::stack::isolate::IsolationState;
use crate::stack::rate_limit::limiter::Limiter;
use crate::stack::routing::{check_all, discover_all, Router};
use crate::upstream::Upstream;

/// How often idle tenant counters and expired prompt fingerprints are dropped. Both are
/// correct without it (expiry is by timestamp, memory is capped); this returns the memory.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(60);

pub(crate) async fn housekeeping_loop(
    limiter: Limiter,
    isolation: Arc<IsolationState>,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HOUSEKEEPING_INTERVAL) => {
                limiter.sweep();
                isolation.store.expire(std::time::Instant::now());
            }
            _ = shutdown.wait() => return,
        }
    }
}

pub(crate) async fn discovery_loop(
    router: Arc<Router>,
    upstream: Upstream,
    every: Duration,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => discover_all(&router, &upstream).await,
            _ = shutdown.wait() => return,
        }
    }
}

/// Probe every worker's health on `[health] interval` (the first round right away: a worker
/// that is down at start-up is found within `unhealthy_threshold` intervals).
pub(crate) async fn health_loop(
    router: Arc<Router>,
    upstream: Upstream,
    config: HealthConfig,
    mut shutdown: Shutdown,
) {
    let mut ticks = tokio::time::interval(config.interval);
    // A slow round delays the next one instead of bunching probes after it.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => check_all(&router, &upstream, config.timeout).await,
            _ = shutdown.wait() => return,
        }
    }
}

/// Close one bucket of recent activity every [`BUCKET`], so the request path only adds.
pub(crate) async fn activity_loop(activity: Arc<Activity>, mut shutdown: Shutdown) {
    let mut ticks = tokio::time::interval(BUCKET);
    // A late tick makes one longer bucket, not a burst of empty ones.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the history already starts at construction.
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => activity.sample(std::time::Instant::now()),
            _ = shutdown.wait() => return,
        }
    }
}
