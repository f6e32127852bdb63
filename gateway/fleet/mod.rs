//! The fleet: the engine pools and their workers, as the gateway knows them between
//! requests — capacity discovery, active health probes, outlier ejection, engine versions,
//! drains and each pool's signal window.
//!
//! The request path reads it (admission sizes prompts by its KV bounds, routing picks its
//! workers, dispatch and the guard report outcomes to its workers); the runtime keeps it
//! (discovery and health loops, reload), and the admin port, the rollouts, preflight and
//! `kvgate check` act on it. None of it knows about a request stage: `stack::routing`
//! chooses for one request, this module holds what it chooses from.
//!
//! - `pool`: one `[[pools]]` entry, live: its workers by role, weight, in-flight cap.
//! - `worker`: one engine process: address, role, load, capacity, versions, drain.
//! - `load`, `load_poll`: live load per worker — the KV kvgate holds there, the engine's
//!   own report (polled on the health interval) and the room they leave.
//! - `discovery`: what each engine reports about itself (capacity, limits, version).
//! - `cache_tiers`: each worker's cache tiers below the GPU prefix cache; a tier that
//!   ignores the salt keeps a worker from serving a pool that separates tenants (issue 40).
//! - `health`, `health_check`: active probes and outlier ejection, per worker.
//! - `names`: the DNS names that list a pool's workers, their last good answers and how
//!   their latest resolution went (`discover`; issue 39).
//! - `window`: each pool's sliding window of outcomes (canary rollouts compare them).
//! - `queue`: a full pool's bounded gateway queue: priority classes, weighted fair
//!   queuing across tenants (`[scheduling]`; issue 30).
//! - `prefix_index`: which prompt blocks were recently sent to which worker of a pool
//!   (`[prefix_routing]`; issue 31); `prefix_outbox` and `prefix_share`: the indexes
//!   shared between replicas through Redis, approximately, off the request path.

mod cache_tiers;
mod discovery;
mod health;
mod health_check;
mod load;
mod load_poll;
mod names;
mod pool;
mod prefix_index;
mod prefix_outbox;
mod prefix_share;
mod promised;
mod queue;
mod share;
mod window;
mod worker;

pub use cache_tiers::{parse_reported, CachePolicy, ReportedTiers, Tier, TierSource};
pub use discovery::{discover_all, discover_worker, parse_server_info};
pub use health::{
    Ejection, EjectionGroup, HealthPolicy, HealthSnapshot, ProbeSnapshot, ProbeVerdict, Serving,
    WorkerHealth,
};
pub use health_check::{check_all, report_ejection};
pub use load::{
    allowed, parse_sglang_loads, parse_vllm_metrics, prometheus_samples, room_of, EngineLoad,
    KvCost, STALE_AFTER_INTERVALS,
};
pub use load_poll::poll_loads;
pub use names::{Endpoint, NameBook, NameKey, NameState};
pub use pool::{CountRules, OutcomeWatch, Pool, PoolWorkers};
pub use prefix_index::{Candidate, IndexSize, PrefixCounters, PrefixIndex};
pub use prefix_outbox::Outbox;
pub use prefix_share::{share_loop, PrefixShare};
pub use promised::Promised;
pub use queue::{FairQueue, Head, QueueEntry, QueueRefusal, QueueSnapshot, Ticket};
pub use share::{keeps_fit, Reserve, ShareHold, TenantShares, WaitingMark};
pub use window::{Outcome, Rates, SignalWindow};
pub use worker::claim::WorkerLoad;
pub use worker::{Discovery, Role, ServerInfo, Worker};

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::config::{Config, EngineVersion};

/// A pool's signal window when no rollout names it (the admin port still shows its rates).
const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// Every pool of one config, grouped by model.
#[derive(Debug)]
pub struct Fleet {
    pools: Vec<Arc<Pool>>,
    /// A model's pools, and the counter of its request-by-request weighted split.
    by_model: HashMap<String, (Vec<Arc<Pool>>, AtomicU64)>,
    /// `[scheduling] kv_overcommit`: the share of a worker's KV pool that may be promised.
    kv_overcommit: f64,
    /// Set once the process shuts down: nothing new is dispatched. One flag for every
    /// generation (a reload's fleet takes its predecessor's) and shared with the pools, so
    /// requests waiting in an older generation's queue see it too.
    draining: Arc<std::sync::atomic::AtomicBool>,
    /// The DNS names of `discover` entries and their answers: the process's, shared by
    /// every generation.
    names: Arc<NameBook>,
}

impl Fleet {
    /// Build the live pools from validated config.
    pub fn from_config(config: &Config) -> Self {
        Self::reusing(config, None)
    }

    /// The process shuts down: every queued request is refused at once (503 with
    /// Retry-After: it has not started, so a retry loses nothing) and nothing new is
    /// dispatched, so the drain only waits for what already runs (issue 38).
    pub fn begin_drain(&self) {
        self.draining
            .store(true, std::sync::atomic::Ordering::Relaxed);
        for pool in &self.pools {
            pool.queue.close_with(QueueRefusal::Draining);
        }
    }

    /// Whether [`Fleet::begin_drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Build the live pools of a reloaded `config`, taking over from `previous` (the
    /// running config and its fleet) every pool whose settings did not change: its
    /// workers keep their discovered capacity, health, ejections, drain and load, and the
    /// pool its weight (admin and rollout changes included) and signal window. A pool
    /// whose entry changed in any way (its weight in the file included), or whose model
    /// minimum, rollout window or `[health]` changed, is built afresh.
    pub fn reusing(config: &Config, previous: Option<(&Config, &Fleet)>) -> Self {
        let health = Arc::new(HealthPolicy::from_config(&config.health));
        let window_of = |config: &Config, pool: &str| {
            config
                .rollouts
                .iter()
                .find(|r| r.stable == pool || r.canary == pool)
                .map_or(DEFAULT_WINDOW, |r| r.window)
        };
        let min_of = |config: &Config, model: &str| {
            config
                .model(model)
                .and_then(|m| m.min_engine_version.clone())
        };
        let draining = previous.map_or_else(Arc::default, |(_, fleet)| fleet.draining.clone());
        let names = previous.map_or_else(Arc::default, |(_, fleet)| fleet.names.clone());
        let pools: Vec<Arc<Pool>> = config
            .pools
            .iter()
            .map(|p| {
                let window = window_of(config, &p.name);
                let kept = previous.and_then(|(old, fleet)| {
                    let unchanged = old.health == config.health
                        && old.pools.iter().any(|o| o == p)
                        && old.separates_tenants(p) == config.separates_tenants(p)
                        && window_of(old, &p.name) == window
                        && min_of(old, &p.model) == min_of(config, &p.model);
                    unchanged.then(|| fleet.pool(&p.name).cloned()).flatten()
                });
                kept.unwrap_or_else(|| {
                    // Validated at load; an unreadable minimum cannot reach here.
                    let min = min_of(config, &p.model).and_then(|v| EngineVersion::parse(&v).ok());
                    let before = previous.and_then(|(_, fleet)| fleet.pool(&p.name));
                    let pool = Pool::new(
                        p,
                        window,
                        min.as_ref(),
                        &health,
                        config.scheduling.max_queued,
                        &config.prefix_routing,
                        before.map(|p| &**p),
                        draining.clone(),
                        Arc::new(CachePolicy::of(config, p)),
                    );
                    // Only its workers changed (a DNS answer, a worker added to or removed
                    // from the file): the same pool with other engines, not a new one.
                    let same_but_workers = previous.zip(before).is_some_and(|((old, _), _)| {
                        old.health == config.health
                            && window_of(old, &p.name) == window
                            && min_of(old, &p.model) == min_of(config, &p.model)
                            && old.prefix_routing == config.prefix_routing
                            && old.separates_tenants(p) == config.separates_tenants(p)
                            && old
                                .pools
                                .iter()
                                .find(|o| o.name == p.name)
                                .is_some_and(|o| o.same_apart_from_workers(p))
                    });
                    Arc::new(match (same_but_workers, before) {
                        (true, Some(before)) => pool.inheriting(before),
                        _ => pool,
                    })
                })
            })
            .collect();
        let mut by_model: HashMap<String, (Vec<Arc<Pool>>, AtomicU64)> = HashMap::new();
        for pool in &pools {
            pool.publish_weight();
            by_model
                .entry(pool.model.clone())
                .or_insert_with(|| (Vec::new(), AtomicU64::new(0)))
                .0
                .push(pool.clone());
        }
        Self {
            pools,
            by_model,
            kv_overcommit: config.scheduling.kv_overcommit,
            draining,
            names,
        }
    }

    /// The DNS names of `discover` entries and their last answers.
    pub fn names(&self) -> &Arc<NameBook> {
        &self.names
    }

    /// Every pool.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// The pools of a model.
    pub fn pools_of(&self, model: &str) -> &[Arc<Pool>] {
        self.by_model
            .get(model)
            .map(|(p, _)| p.as_slice())
            .unwrap_or(&[])
    }

    /// The pools of a model and the counter that splits its anonymous traffic by weight
    /// (None: no pool serves the model).
    pub fn model(&self, model: &str) -> Option<(&[Arc<Pool>], &AtomicU64)> {
        self.by_model
            .get(model)
            .map(|(pools, counter)| (pools.as_slice(), counter))
    }

    /// `[scheduling] kv_overcommit` of this config (room is counted against capacity × it).
    pub fn kv_overcommit(&self) -> f64 {
        self.kv_overcommit
    }

    /// Every worker of every pool.
    pub fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.pools.iter().flat_map(|p| p.all_workers())
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| &*p.name == name)
    }
}

/// When a worker of `pools` may serve again (the 503's `Retry-After`): the soonest end of
/// an ejection or recovery; 1 s when no worker is out for its health.
pub fn retry_after(pools: &[Arc<Pool>]) -> std::time::Duration {
    pools
        .iter()
        .filter_map(|p| p.back_in())
        .min()
        .unwrap_or(std::time::Duration::from_secs(1))
}
