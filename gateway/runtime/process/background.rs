//! The gateway's background loops on the main runtime: capacity discovery, DNS discovery of
//! engines, active health checks, the sweeps that give back memory and the status page's
//! activity buckets.

use std::sync::Arc;
use std::time::Duration;

use crate::activity::{Activity, BUCKET};
use crate::fleet::{check_all, discover_all, poll_loads};
use crate::runtime::listener::server::Shutdown;
use crate::runtime::process::live::Live;
use crate::runtime::process::reload::Reloader;
use crate::stack::isolate::FingerprintStore;
use crate::stack::rate_limit::limiter::Limiter;
use crate::tls::CertWatch;
use crate::upstream::Upstream;

/// How often idle tenant counters and expired prompt fingerprints are dropped. Both are
/// correct without it (expiry is by timestamp, memory is capped); this returns the memory.
const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(60);

pub(crate) async fn housekeeping_loop(
    limiter: Limiter,
    fingerprints: FingerprintStore,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HOUSEKEEPING_INTERVAL) => {
                limiter.sweep();
                fingerprints.expire(std::time::Instant::now());
            }
            _ = shutdown.wait() => return,
        }
    }
}

/// Discover every worker's capacity again on `upstream.discovery_interval` (the workers of
/// the config current at each round).
pub(crate) async fn discovery_loop(
    live: Arc<Live>,
    upstream: Upstream,
    every: Duration,
    mut shutdown: Shutdown,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => discover_all(&live.current().fleet, &upstream).await,
            _ = shutdown.wait() => return,
        }
    }
}

/// Resolve the `discover` names again on `[discovery] interval` (of the config in force at
/// each round) and apply a changed answer as a reload does ([`Reloader::refresh_dns`]).
pub(crate) async fn dns_loop(reloader: Reloader, mut shutdown: Shutdown) {
    loop {
        let every = reloader.live.current().config.discovery.interval;
        tokio::select! {
            _ = tokio::time::sleep(every) => {
                if let Err(e) = reloader.refresh_dns().await {
                    tracing::error!(error = %e, "a change of discovered engines was refused: the running workers are kept");
                }
            }
            _ = shutdown.wait() => return,
        }
    }
}

/// Probe every worker's health on `[health] interval` (the first round right away: a worker
/// that is down at start-up is found within `unhealthy_threshold` intervals), then ask each
/// engine for its load (`fleet::poll_loads`).
///
/// `[health]` is read from the current config at each round, so a reload that changes
/// it (or turns probing on or off) takes effect at the next one.
pub(crate) async fn health_loop(live: Arc<Live>, upstream: Upstream, mut shutdown: Shutdown) {
    let mut interval = live.current().config.health.interval;
    let mut ticks = tokio::time::interval(interval);
    // A slow round delays the next one instead of bunching probes after it.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                let generation = live.current();
                let health = &generation.config.health;
                if health.active {
                    // Probes first: the load poll of a worker found down is then moot
                    // (it answers nothing and keeps no report).
                    check_all(&generation.fleet, &upstream, health.timeout).await;
                    poll_loads(&generation.fleet, &upstream, health.timeout).await;
                }
                if health.interval != interval {
                    interval = health.interval;
                    ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
                    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                }
            }
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
