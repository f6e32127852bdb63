//! One engine process: its address, role, load and capacity.
//!
//! Capacity is the smaller of the configured `kv_tokens` and what the engine reports
//! (`/get_server_info` → `scheduler_info.max_total_num_tokens`); a worker whose capacity is
//! neither configured nor discovered is not eligible to serve (I3), nor is one whose cache
//! tiers ignore the salt on a pool that keeps tenants apart (I5; `worker/tiers.rs`).
//!
//! Its live load (`claim`: outstanding requests and the KV they hold, the engine's own
//! report, the room left) is in `worker/claim.rs`, over [`super::load`]; its running slots
//! in `worker/slots.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use super::health::{EjectionGroup, HealthPolicy, Serving, WorkerHealth};
use super::load::KvAccount;
use crate::config::{EngineVersion, WorkerConfig};
use crate::metrics;
pub use info::{Discovery, ServerInfo};

/// What a worker does for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Does prefill and decode (unified pools).
    Unified,
    /// Computes the prompt's KV and hands it to a decode worker.
    Prefill,
    /// Receives KV from a prefill worker and generates.
    Decode,
}

impl Role {
    /// A metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Unified => "unified",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// A worker of a pool.
#[derive(Debug)]
pub struct Worker {
    /// Pool name (metric label).
    pub pool: Arc<str>,
    /// The role in its pool.
    pub role: Role,
    /// Base URL as configured (no trailing slash).
    pub base_url: String,
    /// Authority (`host:port`), a metric label.
    pub authority: String,
    /// Host that decode workers reach for KV (prefill only).
    pub bootstrap_host: String,
    configured_kv_tokens: Option<u64>,
    /// `max_running` (the worker's, else its pool's).
    configured_max_running: Option<u64>,
    /// What the engine's load report last said of its running slots (0: nothing).
    reported_max_running: AtomicU64,
    configured_bootstrap_port: Option<u16>,
    discovery: RwLock<Discovery>,
    /// The pool's configured `version` (what the engine reports takes precedence).
    configured_version: Option<String>,
    /// The model's `min_engine_version`.
    min_version: Option<EngineVersion>,
    /// Drained through the admin API: no new requests, in-flight ones finish.
    draining: AtomicBool,
    /// Active probes and passive outlier ejection.
    health: WorkerHealth,
    /// The active health check's path.
    health_path: String,
    /// Requests kvgate has here (shared with the worker it succeeds on a reload).
    outstanding: Arc<AtomicUsize>,
    /// The outstanding-requests gauge, looked up once (on first use, so after the
    /// recorder is installed) instead of on every request start and end.
    outstanding_gauge: std::sync::OnceLock<::metrics::Gauge>,
    /// kvgate's account of the KV held here, and the engine's last load report (shared
    /// with the worker it succeeds on a reload).
    kv: Arc<KvAccount>,
    /// Its place among its pool's workers of its role (the pool's prefix index names it so).
    slot: usize,
    /// Moves on whenever it leaves service (drained, ejected, down): what the pool's prefix
    /// index remembers of it from before no longer counts (see `worker/cache.rs`).
    cache_epoch: AtomicU64,
    /// What its pool asks of its cache tiers (`worker/tiers.rs`).
    cache_policy: Arc<super::CachePolicy>,
}

impl Worker {
    /// A worker from its config entry.
    pub fn new(pool: Arc<str>, role: Role, config: &WorkerConfig) -> Self {
        let authority = config
            .url
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let host = config.url.host().unwrap_or_default().to_owned();
        let scheme = config.url.scheme_str().unwrap_or("http");
        Self {
            pool,
            role,
            base_url: format!("{scheme}://{authority}"),
            authority,
            bootstrap_host: config.bootstrap_host.clone().unwrap_or(host),
            configured_kv_tokens: config.kv_tokens,
            configured_max_running: config.max_running.map(u64::from),
            reported_max_running: AtomicU64::new(0),
            configured_bootstrap_port: config.bootstrap_port,
            discovery: RwLock::new(Discovery::Pending),
            configured_version: None,
            min_version: None,
            draining: AtomicBool::new(false),
            health: WorkerHealth::new(
                Arc::new(HealthPolicy::default()),
                Arc::new(EjectionGroup::new(1, 0.0)),
            ),
            health_path: "/health".to_owned(),
            outstanding: Arc::new(AtomicUsize::new(0)),
            outstanding_gauge: std::sync::OnceLock::new(),
            kv: Arc::new(KvAccount::new(Arc::new(Notify::new()))),
            slot: 0,
            cache_epoch: AtomicU64::new(0),
            cache_policy: Arc::default(),
        }
    }

    /// Its place among its pool's workers of its role.
    pub fn with_slot(mut self, slot: usize) -> Self {
        self.slot = slot;
        self
    }

    /// Wake `room_freed` (its pool's) when this worker's room grows.
    pub fn with_room_freed(mut self, room_freed: Arc<Notify>) -> Self {
        self.kv = Arc::new(KvAccount::new(room_freed));
        self
    }

    /// Take over the account of `previous`, the worker of the same address and role in the
    /// pool a reload rebuilds as this one's: the requests still running there keep counting
    /// here (and give their KV back here), so a rebuilt pool never has more in flight on
    /// an engine than capacity × overcommit (issue 38). Call after `with_room_freed`.
    ///
    /// It also keeps what is known of the engine — its last discovery answer, so a worker
    /// that survives a DNS change serves on without a new probe — and an admin drain, which
    /// a rebuild must not undo, and its health verdicts (counted in the new pool's groups).
    pub fn carrying(mut self, previous: &Worker) -> Self {
        self.discovery = RwLock::new(previous.discovery());
        self.draining = AtomicBool::new(previous.is_draining());
        self.health.carry_from(&previous.health);
        // Both pools are notified while both live: requests may still wait in the old
        // generation's queue (a reload that fails after building this one keeps it).
        previous.kv.also_notify(&self.kv);
        self.kv = previous.kv.clone();
        self.outstanding = previous.outstanding.clone();
        self
    }

    /// The pool's configured version and the model's minimum.
    pub fn with_versions(mut self, configured: Option<&str>, min: Option<EngineVersion>) -> Self {
        self.configured_version = configured.map(str::to_owned);
        self.min_version = min;
        self
    }

    /// Health under `policy`, probed at `path`; ejections counted in `group` (its pool's
    /// workers of its role).
    pub fn with_health(
        mut self,
        policy: Arc<HealthPolicy>,
        group: Arc<EjectionGroup>,
        path: &str,
    ) -> Self {
        self.health = WorkerHealth::new(policy, group);
        path.clone_into(&mut self.health_path);
        self
    }

    /// Its health: probes and ejections.
    pub fn health(&self) -> &WorkerHealth {
        &self.health
    }

    /// A request here failed (`cause`, a metric label: connect failure, 5xx, timeout,
    /// unreadable answer, guard trip); enough in a row eject the worker.
    pub fn request_failed(&self, cause: &'static str) {
        if let Some(ejection) = self.health.failure(std::time::Instant::now(), cause) {
            self.left_service();
            super::report_ejection(self, &ejection);
        }
    }

    /// A request of `tenant` here failed in a way its content may have provoked (an error
    /// status): ejects only with another tenant's failures in the run.
    pub fn request_failed_by(&self, cause: &'static str, tenant: &Arc<str>) {
        if let Some(ejection) = self
            .health
            .failure_by(std::time::Instant::now(), cause, tenant)
        {
            self.left_service();
            super::report_ejection(self, &ejection);
        }
    }

    /// A request here succeeded: the run of failures ends, and a trial after an ejection
    /// passes.
    pub fn request_succeeded(&self) {
        if self.health.success() {
            tracing::info!(
                pool = %self.pool, role = self.role.as_str(), worker = %self.authority,
                "worker passed its trial after an ejection: back in service"
            );
            self.publish_gauges();
        }
    }

    /// The path its active health check asks.
    pub fn health_path(&self) -> &str {
        &self.health_path
    }

    /// The engine version: what the engine reported, else the pool's configured one.
    pub fn version(&self) -> Option<String> {
        self.discovered()
            .and_then(|i| i.version)
            .or_else(|| self.configured_version.clone())
    }

    /// The reported version when it differs from the configured one.
    pub fn version_mismatch(&self) -> Option<(String, String)> {
        let reported = self.discovered().and_then(|i| i.version)?;
        let configured = self.configured_version.clone()?;
        let same = match (
            EngineVersion::parse(&reported),
            EngineVersion::parse(&configured),
        ) {
            (Ok(a), Ok(b)) => a == b,
            _ => reported == configured,
        };
        (!same).then_some((configured, reported))
    }

    /// Stop (or resume) giving this worker new requests; in-flight ones are not touched.
    pub fn set_draining(&self, draining: bool) {
        let was = self.draining.swap(draining, Ordering::Relaxed);
        if draining && !was {
            self.left_service();
        }
        self.publish_gauges();
    }

    /// Whether the worker is being drained.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The configured KV pool size, if any.
    pub fn configured_kv_tokens(&self) -> Option<u64> {
        self.configured_kv_tokens
    }

    /// The last discovery result.
    pub fn discovery(&self) -> Discovery {
        match self.discovery.read() {
            Ok(d) => d.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Record a discovery result and publish the capacity gauges.
    pub fn set_discovery(&self, discovery: Discovery) {
        match self.discovery.write() {
            Ok(mut d) => *d = discovery,
            Err(poisoned) => *poisoned.into_inner() = discovery,
        }
        self.publish_gauges();
    }

    fn discovered(&self) -> Option<ServerInfo> {
        match self.discovery() {
            Discovery::Found(info) => Some(info),
            _ => None,
        }
    }

    /// One number of what discovery found, read in place: the request path asks these for
    /// every worker (admission's bounds), and a clone of the whole answer would copy its
    /// strings each time.
    pub(crate) fn discovered_number<T>(
        &self,
        field: impl FnOnce(&ServerInfo) -> Option<T>,
    ) -> Option<T> {
        let guard = self.discovery.read().unwrap_or_else(|p| p.into_inner());
        match &*guard {
            Discovery::Found(info) => field(info),
            _ => None,
        }
    }

    /// The KV pool size the gateway enforces: the smaller of configured and discovered.
    pub fn kv_tokens(&self) -> Option<u64> {
        let discovered = self.discovered_number(|i| i.max_total_num_tokens);
        match (self.configured_kv_tokens, discovered) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether configured and discovered capacity disagree.
    pub fn capacity_mismatch(&self) -> Option<(u64, u64)> {
        let discovered = self.discovered_number(|i| i.max_total_num_tokens)?;
        let configured = self.configured_kv_tokens?;
        (configured != discovered).then_some((configured, discovered))
    }

    /// The engine's own input limit when it reported one.
    pub fn discovered_max_req_input_len(&self) -> Option<u64> {
        self.discovered_number(|i| i.max_req_input_len)
    }

    /// The engine's own context length when it reported one.
    pub fn discovered_context_length(&self) -> Option<u64> {
        self.discovered_number(|i| i.context_length)
    }

    /// The KV bootstrap port (prefill): configured, else discovered.
    pub fn bootstrap_port(&self) -> Option<u16> {
        self.configured_bootstrap_port
            .or_else(|| self.discovered_number(|i| i.bootstrap_port))
    }

    /// Why this worker may not serve, or `None` when it may.
    pub fn ineligibility(&self) -> Option<String> {
        if self.is_draining() {
            return Some(
                "draining (admin API, or gone from its pool's list): in-flight requests finish, no new ones".into(),
            );
        }
        match self.health.serving() {
            Serving::Yes => {}
            Serving::Trial if self.outstanding() == 0 => {}
            Serving::Trial => {
                return Some(
                    "on trial after an ejection: one request at a time until one succeeds".into(),
                )
            }
            Serving::Ejected { remaining, cause } => {
                return Some(format!(
                    "ejected after failures in a row (last: {cause}) for {} s more",
                    remaining.as_secs_f64().ceil()
                ))
            }
            Serving::Down { error } => {
                return Some(format!(
                    "failing its health check (GET {}): {error}",
                    self.health_path
                ))
            }
        }
        if let Some(min) = &self.min_version {
            match self.version().map(|v| EngineVersion::parse(&v)) {
                None => {
                    return Some(format!(
                        "engine version unknown; min_engine_version {min} needs one (the engine reports none and the pool sets no `version`)"
                    ))
                }
                Some(Err(e)) => return Some(format!("engine version unreadable: {e}")),
                Some(Ok(v)) if v < *min => {
                    return Some(format!(
                        "engine version {v} is older than min_engine_version {min}"
                    ))
                }
                Some(Ok(_)) => {}
            }
        }
        if self.kv_tokens().is_none() {
            let why = match self.discovery() {
                Discovery::Pending => "not discovered yet".to_owned(),
                Discovery::Failed(e) => e,
                Discovery::Found(_) => "engine did not report max_total_num_tokens".to_owned(),
            };
            return Some(format!(
                "KV capacity unknown (kv_tokens not configured; discovery: {why})"
            ));
        }
        if self.role == Role::Prefill && self.bootstrap_port().is_none() {
            return Some("KV bootstrap port unknown (configure bootstrap_port)".to_owned());
        }
        self.cache_tier_refusal()
    }

    /// Whether the worker may serve (I3).
    pub fn is_eligible(&self) -> bool {
        self.ineligibility().is_none()
    }

    /// Requests currently outstanding here.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    fn labels(&self) -> [(&'static str, String); 3] {
        [
            ("pool", self.pool.to_string()),
            ("role", self.role.as_str().to_owned()),
            ("worker", self.authority.clone()),
        ]
    }

    fn outstanding_gauge(&self) -> &::metrics::Gauge {
        self.outstanding_gauge
            .get_or_init(|| ::metrics::gauge!(metrics::WORKER_OUTSTANDING, &self.labels()))
    }

    /// Publish eligibility and capacity gauges.
    pub fn publish_gauges(&self) {
        // Exported from the first publication, not only after the first request (issue 40).
        self.outstanding_gauge().increment(0.0);
        let labels = self.labels();
        metrics::zero::worker(&labels);
        ::metrics::gauge!(metrics::WORKER_ELIGIBLE, &labels).set(if self.is_eligible() {
            1.0
        } else {
            0.0
        });
        let healthy = matches!(self.health.serving(), Serving::Yes | Serving::Trial);
        ::metrics::gauge!(metrics::WORKER_HEALTHY, &labels).set(if healthy { 1.0 } else { 0.0 });
        let sourced = |source: &'static str, value: Option<u64>| {
            if let Some(v) = value {
                let mut l = labels.to_vec();
                l.push(("source", source.to_owned()));
                ::metrics::gauge!(metrics::WORKER_KV_TOKENS, &l).set(v as f64);
            }
        };
        sourced("configured", self.configured_kv_tokens);
        sourced(
            "discovered",
            self.discovered_number(|i| i.max_total_num_tokens),
        );
        sourced("enforced", self.kv_tokens());
        ::metrics::gauge!(metrics::WORKER_CAPACITY_MISMATCH, &labels).set(
            if self.capacity_mismatch().is_some() {
                1.0
            } else {
                0.0
            },
        );
    }
}

// === impl Peer for Worker ===

impl crate::upstream::Peer for Worker {
    fn base_url(&self) -> &str {
        &self.base_url
    }
    fn pool(&self) -> &str {
        &self.pool
    }
    fn role(&self) -> &'static str {
        self.role.as_str()
    }
    fn authority(&self) -> &str {
        &self.authority
    }
}

mod cache;
pub(super) mod claim;
mod info;
mod slots;
#[cfg(test)]
mod tests;
mod tiers;
