//! The gateway's background loops on the main runtime: capacity discovery, active health
//! checks and the sweeps that give back memory.

use std::sync::Arc;
use std::time::Duration;

use crate::config::HealthConfig;
use crate::runtime::server::Shutdown;
use crate::stack::isolate::IsolationState;
use crate::stack::rate_limit::limiter::Limiter;
use crate::stack::routing::{check_all, discover_all, Router};
use crate::tls::CertWatch;
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

/// Read certificate files again when they change (`server.tls_watch_interval`).
pub(crate) async fn cert_watch_loop(
    certs: Arc<CertWatch>,
    interval: Duration,
    mut shutdown: Shutdown,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                // A few stat calls, and a PEM parse only when a file changed.
                certs.reload_changed();
            }
            _ = shutdown.wait() => return,
        }
    }
}
