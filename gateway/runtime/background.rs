//! The gateway's background loops on the main runtime: capacity discovery and the sweeps
//! that give back memory.

use std::sync::Arc;
use std::time::Duration;

use crate::runtime::server::Shutdown;
use crate::stack::isolate::IsolationState;
use crate::stack::rate_limit::limiter::Limiter;
use crate::stack::routing::{discover_all, Router};
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
