//! Engine pools: the workers of one model behind one engine version, with a traffic weight.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::allowed;

use super::{
    EjectionGroup, FairQueue, HealthPolicy, PrefixIndex, Promised, Role, SignalWindow,
    TenantShares, Worker,
};
use crate::config::{
    ChatRules, EngineKind, EngineVersion, PoolConfig, PoolMode, PrefixRoutingConfig,
};
use crate::load::InFlightLimit;

/// Looks at a pool's signal window after a request of the pool was counted in it: the
/// canary rollouts (`crate::rollout::Rollouts`), which may roll back or promote then.
pub trait OutcomeWatch: Send + Sync + std::fmt::Debug + 'static {
    /// One more request of `pool` was counted in its window at `now`.
    fn counted(&self, pool: &Pool, now: Instant);
}

/// The workers of a pool, by mode.
#[derive(Debug)]
pub enum PoolWorkers {
    /// One worker serves a request.
    Unified(Vec<Arc<Worker>>),
    /// A prefill and a decode worker serve a request together.
    Disaggregated {
        prefill: Vec<Arc<Worker>>,
        decode: Vec<Arc<Worker>>,
    },
}

/// One `[[pools]]` entry, live.
#[derive(Debug)]
pub struct Pool {
    /// The process is shutting down (its fleet's flag, shared by every generation).
    draining: Arc<std::sync::atomic::AtomicBool>,
    pub name: Arc<str>,
    pub model: String,
    pub engine: EngineKind,
    /// How its engines prepare a chat (the rules admission counts its chats by).
    pub chat_rules: ChatRules,
    /// Its engines' pre-resize cap of images (`[pools.images]`; None: current SGLang).
    pub image_cap: Option<u64>,
    /// The weight in the config file (the starting weight; a cleared rollback returns to it).
    pub configured_weight: u32,
    /// The weight now: the config's, or what a rollout or the admin API set.
    weight: AtomicU32,
    /// The configured engine version (the engines' own report takes precedence).
    pub version: Option<String>,
    /// Recent trips, engine failures, leak suspicions and first-byte times (canary rollouts
    /// compare these; the admin port shows them for every pool).
    pub signals: Arc<SignalWindow>,
    /// Which pool this is across rebuilds that change only its workers (a DNS change, a
    /// worker added to the file): a rebuilt pool that [inherits](Pool::inheriting) keeps its
    /// predecessor's, so a rollout over it carries on (`rollout::Rollouts::reusing`).
    pub lineage: u64,
    /// The `model` value sent to the engines.
    pub served_model: String,
    pub workers: PoolWorkers,
    /// Only these tenants may use the pool (None: all).
    pub tenants: Option<std::collections::HashSet<String>>,
    /// `max_in_flight`: requests at once on this pool.
    pub in_flight: Option<InFlightLimit>,
    /// Where the round-robin among equally loaded workers goes on, per role (unified or
    /// prefill, decode): routing's picks share them.
    cursors: [AtomicUsize; 2],
    /// Notified when any of its workers gets room back (see [`Pool::room_freed`]).
    room_freed: Arc<tokio::sync::Notify>,
    /// Requests waiting for room when every worker is full (`[scheduling]`): weighted-fair
    /// across tenants within priority classes. The routing stage joins and releases it.
    pub queue: FairQueue,
    /// Room the queue released to requests that have not claimed it yet.
    pub promised: Promised,
    /// Each tenant's KV here against its fair share, and the room kept for tenants below it.
    pub shares: Arc<TenantShares>,
    /// Whether its engines get each tenant's `cache_salt` (their prefix caches are then
    /// partitioned by tenant; otherwise shared by all).
    pub cache_salt: bool,
    /// It salts and more than one tenant may use it: its workers' cache tiers must honour
    /// the salt (`fleet/cache_tiers.rs`), and preflight checks that they do.
    pub separates_tenants: bool,
    /// Which prompt blocks were recently sent to which of its prefix workers (unified, or
    /// PD prefill); None when it has only one, so there is nothing to choose.
    pub prefix: Option<PrefixIndex>,
}

impl Pool {
    /// Build a pool from validated config; its signals cover `window`, workers whose
    /// engine is older than `min_version` may not serve, and `health` governs probes and
    /// ejections (counted per role: never more than its share of the prefill, decode or
    /// unified workers at once); its gateway queue holds at most `max_queued` requests, its
    /// prefix index `prefix.max_blocks` blocks. A pool rebuilt on a reload (or a DNS
    /// change) takes over the accounts, discovered capacity and drain of `previous`'s
    /// workers at the same addresses ([`Worker::carrying`]); its prefix index starts empty.
    pub fn new(
        config: &PoolConfig,
        window: Duration,
        min_version: Option<&EngineVersion>,
        health: &Arc<HealthPolicy>,
        max_queued: usize,
        prefix: &PrefixRoutingConfig,
        previous: Option<&Pool>,
        draining: Arc<std::sync::atomic::AtomicBool>,
        cache_policy: Arc<super::CachePolicy>,
    ) -> Self {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let health_path = config
            .health_path
            .clone()
            .unwrap_or_else(|| match config.engine {
                EngineKind::Sglang => "/health".to_owned(),
                EngineKind::Openai => "/v1/models".to_owned(),
            });
        let room_freed = Arc::new(tokio::sync::Notify::new());
        let build = |list: &[crate::config::WorkerConfig], role| {
            // A `discover` entry stands for the engines its name lists: the resolved config
            // (`crate::dns`) has them as plain entries; unresolved, it has none yet.
            let list: Vec<_> = list.iter().filter(|w| w.discover.is_none()).collect();
            let group = Arc::new(EjectionGroup::new(list.len(), health.max_ejected_share));
            list.into_iter()
                .enumerate()
                .map(|(slot, w)| {
                    let worker = Worker::new(name.clone(), role, w)
                        .with_pool_max_running(config.max_running)
                        .with_slot(slot)
                        .with_versions(config.version.as_deref(), min_version.cloned())
                        .with_health(health.clone(), group.clone(), &health_path)
                        .with_room_freed(room_freed.clone())
                        .with_cache_policy(cache_policy.clone());
                    let predecessor = previous.and_then(|p| {
                        p.all_workers()
                            .find(|o| o.role == role && o.authority == worker.authority)
                    });
                    let worker = match predecessor {
                        Some(old) => worker.carrying(old),
                        None => worker,
                    };
                    Arc::new(worker)
                })
                .collect::<Vec<_>>()
        };
        let workers = match config.mode {
            PoolMode::Unified => PoolWorkers::Unified(build(&config.workers, Role::Unified)),
            PoolMode::Disaggregated => PoolWorkers::Disaggregated {
                prefill: build(&config.prefill, Role::Prefill),
                decode: build(&config.decode, Role::Decode),
            },
        };
        let prefix_workers = match &workers {
            PoolWorkers::Unified(ws) => ws.len(),
            PoolWorkers::Disaggregated { prefill, .. } => prefill.len(),
        };
        let prefix = (prefix_workers > 1)
            .then(|| PrefixIndex::new(prefix_workers, prefix.max_blocks, prefix.max_age));
        Self {
            name: name.clone(),
            model: config.model.clone(),
            engine: config.engine,
            chat_rules: config.chat_rules(),
            image_cap: config.images.pre_resize_max_pixels,
            configured_weight: config.weight,
            weight: AtomicU32::new(config.weight),
            version: config.version.clone(),
            signals: Arc::new(SignalWindow::new(window)),
            lineage: next_lineage(),
            served_model: config
                .served_model
                .clone()
                .unwrap_or_else(|| config.model.clone()),
            workers,
            tenants: (!config.tenants.is_empty()).then(|| config.tenants.iter().cloned().collect()),
            in_flight: config.max_in_flight.map(InFlightLimit::new),
            cursors: [AtomicUsize::new(0), AtomicUsize::new(0)],
            room_freed,
            draining,
            queue: FairQueue::new(max_queued),
            promised: Promised::default(),
            shares: Arc::default(),
            cache_salt: config.cache_salt,
            separates_tenants: cache_policy.separates_tenants,
            prefix,
        }
    }

    /// Take over what `previous` — the same pool before a rebuild that changed only its
    /// workers — learned about its traffic: its weight now (an admin or rollout change), its
    /// signal window, its tenants' fair shares, its `max_in_flight` slots in use, its
    /// lineage, and the prefix index entries of the workers it keeps (those of the workers
    /// gone are purged). An autoscaled fleet is not a new pool. Health starts afresh (the
    /// ejection groups are sized by the new worker count), and requests still queued on
    /// `previous` are served there.
    pub fn inheriting(mut self, previous: &Pool) -> Self {
        self.weight = AtomicU32::new(previous.weight());
        self.signals = previous.signals.clone();
        self.shares = previous.shares.clone();
        if let (Some(old), Some(new)) = (&previous.in_flight, &self.in_flight) {
            if old.max() == new.max() {
                self.in_flight = Some(old.clone());
            }
        }
        self.lineage = previous.lineage;
        if let (Some(old), Some(new)) = (&previous.prefix, &self.prefix) {
            let slots: Vec<Option<usize>> = previous
                .prefix_workers()
                .iter()
                .map(|o| {
                    self.prefix_workers()
                        .iter()
                        .position(|w| w.role == o.role && w.authority == o.authority)
                })
                .collect();
            if let Some(index) = old.remapped(&slots, new) {
                self.prefix = Some(index);
            }
        }
        self
    }

    /// How its engines turn a request into prompt tokens (admission counts by these).
    pub fn count_rules(&self) -> CountRules {
        CountRules {
            chat: self.chat_rules,
            image_cap: self.image_cap,
        }
    }

    /// The traffic weight now.
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// Change the traffic weight (rollouts, the admin API); requests already routed keep
    /// their pool.
    pub fn set_weight(&self, weight: u32) {
        self.weight.store(weight, Ordering::Relaxed);
        self.publish_weight();
    }

    /// Export the weight now (from the fleet's start, not only after its first change).
    pub fn publish_weight(&self) {
        ::metrics::gauge!(crate::metrics::POOL_WEIGHT, "pool" => self.name.to_string())
            .set(f64::from(self.weight()));
    }

    /// Whether `tenant` (pinned to `pinned` pools, if any) may use this pool.
    pub fn serves_tenant(
        &self,
        tenant: &str,
        pinned: Option<&std::collections::HashSet<String>>,
    ) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
            && pinned.is_none_or(|p| p.contains(&*self.name))
    }

    /// The workers a request's prompt prefix chooses among: unified, or PD prefill (decode
    /// workers are chosen by load: they receive the prompt's KV from the prefill worker).
    pub fn prefix_workers(&self) -> &[Arc<Worker>] {
        match &self.workers {
            PoolWorkers::Unified(ws) => ws,
            PoolWorkers::Disaggregated { prefill, .. } => prefill,
        }
    }

    /// Every worker with its role.
    pub fn all_workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        let (a, b): (&[Arc<Worker>], &[Arc<Worker>]) = match &self.workers {
            PoolWorkers::Unified(w) => (w, &[]),
            PoolWorkers::Disaggregated { prefill, decode } => (prefill, decode),
        };
        a.iter().chain(b.iter())
    }

    /// Whether this pool can ever serve a route with these needs (its engine kind and mode
    /// fit), whatever its workers' state.
    pub fn fits_route(&self, needs_sglang: bool, needs_unified: bool) -> bool {
        !(needs_sglang && self.engine != EngineKind::Sglang)
            && !(needs_unified && matches!(self.workers, PoolWorkers::Disaggregated { .. }))
    }

    /// Why this pool cannot take a request now (None: it can); `needs_sglang`: the
    /// endpoint speaks SGLang's own API; `needs_unified`: the engine runs the request in one
    /// process (prefill-only requests). Admission and routing both filter pools with it.
    /// `chosen`: the client named this pool (`x-kvgate-pool`), so weight 0 does not refuse
    /// it (a canary tried by hand).
    pub fn refusal_for(
        &self,
        needs_sglang: bool,
        needs_unified: bool,
        chosen: bool,
    ) -> Option<String> {
        if needs_sglang && self.engine != EngineKind::Sglang {
            return Some(format!(
                "pool `{}` is not an SGLang pool (/generate, /v1/rerank and /v1/score need one)",
                self.name
            ));
        }
        if needs_unified && matches!(self.workers, PoolWorkers::Disaggregated { .. }) {
            return Some(format!(
                "pool `{}` is prefill/decode disaggregated; embeddings, rerank and score need a unified pool",
                self.name
            ));
        }
        if chosen {
            self.worker_ineligibility()
        } else {
            self.ineligibility()
        }
    }

    /// Whether the pool takes a share of traffic now, or why not.
    pub fn ineligibility(&self) -> Option<String> {
        if self.weight() == 0 {
            return Some(format!("pool `{}` has weight 0", self.name));
        }
        self.worker_ineligibility()
    }

    /// Whether the pool's workers can serve, or why not.
    pub fn worker_ineligibility(&self) -> Option<String> {
        let none_eligible = |ws: &[Arc<Worker>], role: &str| {
            (!ws.iter().any(|w| w.is_eligible())).then(|| {
                let reasons: Vec<String> = ws
                    .iter()
                    .filter_map(|w| w.ineligibility().map(|r| format!("{}: {r}", w.authority)))
                    .collect();
                format!(
                    "pool `{}` has no eligible {role} worker ({})",
                    self.name,
                    reasons.join("; ")
                )
            })
        };
        match &self.workers {
            PoolWorkers::Unified(ws) => none_eligible(ws, "unified"),
            PoolWorkers::Disaggregated { prefill, decode } => {
                none_eligible(prefill, "prefill").or_else(|| none_eligible(decode, "decode"))
            }
        }
    }

    /// How long until an ejected or down worker of this pool may serve again: the
    /// soonest end of an ejection or recovery (None: no worker is out for its health).
    pub fn back_in(&self) -> Option<Duration> {
        let now = std::time::Instant::now();
        self.all_workers()
            .filter_map(|w| w.health().back_in(now))
            .min()
    }

    /// The round-robin cursor of `role`'s workers (routing's least-outstanding picks).
    pub fn cursor(&self, role: Role) -> &AtomicUsize {
        match role {
            Role::Decode => &self.cursors[1],
            Role::Unified | Role::Prefill => &self.cursors[0],
        }
    }

    /// Notified (`notify_waiters`) whenever one of its workers gets room back: a request's
    /// load guard dropped (its KV and outstanding slot given back), or an engine reported
    /// using less KV than before. Whoever waits for room registers first
    /// (`Notified::enable`), then checks [`Worker::room`], then awaits.
    pub fn room_freed(&self) -> &Arc<tokio::sync::Notify> {
        &self.room_freed
    }

    /// Whether the process is shutting down: nothing waiting in its queue is dispatched.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// What a request of `kv` tokens is charged on the request-holding worker where that is
    /// least ([`Worker::charge`]: at least one running slot's share where slots are known):
    /// the one number its place in the queue and its tenant's waiting share count.
    pub fn least_charge(&self, kv: u64, overcommit: f64) -> u64 {
        self.holding_workers()
            .iter()
            .filter(|w| w.is_eligible())
            .map(|w| w.charge(kv, overcommit))
            .min()
            .unwrap_or(kv)
    }

    /// The KV tokens its eligible request-holding workers (unified or decode) may have in
    /// flight: their capacity × `overcommit` (tenants' fair shares divide this).
    pub fn kv_capacity(&self, overcommit: f64) -> u64 {
        self.holding_workers()
            .iter()
            .filter(|w| w.is_eligible())
            .filter_map(|w| w.kv_tokens())
            .map(|c| allowed(c, overcommit))
            .fold(0, u64::saturating_add)
    }

    /// The workers that hold a request's KV until its answer ends: unified, or decode.
    pub fn holding_workers(&self) -> &[Arc<Worker>] {
        match &self.workers {
            PoolWorkers::Unified(ws) => ws,
            PoolWorkers::Disaggregated { decode, .. } => decode,
        }
    }
}

/// A new pool's lineage: unique in the process.
fn next_lineage() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How a pool's engines turn a request into prompt tokens: their chat preparation, and
/// the pre-resize cap older SGLang releases put on images. A request is counted once per
/// distinct rules among the pools it may go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CountRules {
    pub chat: ChatRules,
    pub image_cap: Option<u64>,
}

impl Default for CountRules {
    fn default() -> Self {
        Self {
            chat: ChatRules::Sglang,
            image_cap: None,
        }
    }
}
