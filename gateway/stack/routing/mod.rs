//! Routing: which pool and which workers serve a request.
//!
//! A model's pools share its traffic by weight (canary rollouts). The split is sticky per
//! tenant ([`pick::rendezvous`]): while weights stand still a tenant's requests all land on
//! one pool, so a conversation is not spread over two engine versions; when weights change
//! only the tenants at the moving edge move. Anonymous traffic has no tenant to stick to
//! and is split request by request. A tenant with `choose_pool` may name a pool with
//! `x-kvgate-pool` (even at weight 0: a canary tried by hand). Inside a pool the least
//! loaded eligible worker is picked, per role. Only eligible workers (known capacity, a new
//! enough engine, not draining; I3) are ever chosen.
//!
//! Reads: `InferenceRequest`, `AdmittedPools`, `AuthContext`, `PoolChoice`. Writes: the
//! [`RoutePlan`] extension, whose worker loads live until the response body ends.

mod discovery;
mod health;
mod health_check;
mod pick;
mod pool;
mod worker;

pub use crate::config::{EngineVersion, VersionError};
pub use discovery::{discover_all, discover_worker, parse_server_info};
pub use health::{
    Ejection, EjectionGroup, HealthPolicy, HealthSnapshot, ProbeSnapshot, ProbeVerdict, Serving,
    WorkerHealth,
};
pub use health_check::{check_all, report_ejection};
pub use pool::{Pool, PoolWorkers, Target};
pub use worker::{Discovery, Role, ServerInfo, Worker, WorkerLoad};

use bytes::Bytes;
use http::Request;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tower::filter::{FilterLayer, Predicate};

use crate::body::BoxError;
use crate::config::Config;
use crate::error::GatewayError;
use crate::load::InFlightSlot;
use crate::stack::api::InferenceRequest;
use crate::stack::auth::AuthContext;

/// The header naming the pool a tenant with `choose_pool` wants.
pub const POOL_CHOICE_HEADER: &str = "x-kvgate-pool";

/// The pool the client chose with `x-kvgate-pool` (written by tenant rules, once allowed).
#[derive(Debug, Clone)]
pub struct PoolChoice(pub Arc<str>);

/// A pool's signal window when no rollout names it (the admin port still shows its rates).
const DEFAULT_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// The pools a request was admitted to (never empty; written by admission); routing
/// picks among them.
#[derive(Debug, Clone)]
pub struct AdmittedPools(pub Arc<[Arc<str>]>);

/// The route chosen for one request.
#[derive(Debug, Clone)]
pub struct RoutePlan {
    pub pool: Arc<Pool>,
    /// The chosen workers; shared so the plan can be cloned into the response body guard.
    pub target: Arc<Target>,
    /// The pool's in-flight slot (pools with `max_in_flight`), held until the body ends.
    pub slot: Option<Arc<InFlightSlot>>,
}

/// Which workers served a request (a response extension set by dispatch): the audit
/// names them, and the request's outcome counts for their outlier ejection.
#[derive(Debug, Clone)]
pub struct ServedBy {
    /// The unified or decode worker.
    pub worker: Arc<Worker>,
    pub prefill: Option<Arc<Worker>>,
}

/// All pools, grouped by model.
#[derive(Debug)]
pub struct Router {
    pools: Vec<Arc<Pool>>,
    by_model: HashMap<String, (Vec<Arc<Pool>>, AtomicU64)>,
}

impl Router {
    /// Build the live pools from validated config.
    pub fn from_config(config: &Config) -> Self {
        Self::reusing(config, None)
    }

    /// Build the live pools of a reloaded `config`, taking over from `previous` (the
    /// running config and its router) every pool whose settings did not change: its
    /// workers keep their discovered capacity, health, ejections, drain and load, and the
    /// pool its weight (admin and rollout changes included) and signal window. A pool
    /// whose entry changed in any way (its weight in the file included), or whose model
    /// minimum, rollout window or `[health]` changed, is built afresh.
    pub fn reusing(config: &Config, previous: Option<(&Config, &Router)>) -> Self {
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
        let pools: Vec<Arc<Pool>> = config
            .pools
            .iter()
            .map(|p| {
                let window = window_of(config, &p.name);
                let kept = previous.and_then(|(old, router)| {
                    let unchanged = old.health == config.health
                        && old.pools.iter().any(|o| o == p)
                        && window_of(old, &p.name) == window
                        && min_of(old, &p.model) == min_of(config, &p.model);
                    unchanged.then(|| router.pool(&p.name).cloned()).flatten()
                });
                kept.unwrap_or_else(|| {
                    // Validated at load; an unreadable minimum cannot reach here.
                    let min = min_of(config, &p.model).and_then(|v| EngineVersion::parse(&v).ok());
                    Arc::new(Pool::new(p, window, min.as_ref(), &health))
                })
            })
            .collect();
        let mut by_model: HashMap<String, (Vec<Arc<Pool>>, AtomicU64)> = HashMap::new();
        for pool in &pools {
            by_model
                .entry(pool.model.clone())
                .or_insert_with(|| (Vec::new(), AtomicU64::new(0)))
                .0
                .push(pool.clone());
        }
        Self { pools, by_model }
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

    /// Every worker of every pool.
    pub fn workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.pools.iter().flat_map(|p| p.all_workers())
    }

    /// A pool by name.
    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| &*p.name == name)
    }

    /// Choose a pool among those able to serve `request` — the chosen one, else by weight,
    /// sticky per `tenant` when there is one — then its workers. `admitted` (when not
    /// empty) limits the choice to the pools admission let through.
    pub fn route(
        &self,
        request: &InferenceRequest,
        admitted: &[Arc<str>],
        tenant: Option<&str>,
        choice: Option<&str>,
    ) -> Result<RoutePlan, GatewayError> {
        let no_worker = |reason: String| GatewayError::NoEligibleWorker {
            model: request.model.clone(),
            reason,
            retry_after: retry_after(self.pools_of(&request.model)),
        };
        let Some((pools, counter)) = self.by_model.get(&request.model) else {
            return Err(no_worker("no pool serves this model".into()));
        };
        let mut reasons = Vec::new();
        let candidates: Vec<&Arc<Pool>> = pools
            .iter()
            .filter(|pool| {
                if !admitted.is_empty() && !admitted.contains(&pool.name) {
                    return false;
                }
                if choice.is_some_and(|c| c != &*pool.name) {
                    return false;
                }
                match pool.refusal_for(request.endpoint, choice.is_some()) {
                    Some(r) => {
                        reasons.push(r);
                        false
                    }
                    None => true,
                }
            })
            .collect();
        // Weights are read once: a rollout changing them meanwhile affects the next request.
        let weights: Vec<u32> = candidates.iter().map(|p| p.weight()).collect();
        let order: Vec<usize> = match (choice, tenant) {
            (Some(_), _) => (0..candidates.len()).collect(),
            (None, Some(tenant)) => {
                let names: Vec<&str> = candidates.iter().map(|p| &*p.name).collect();
                pick::rendezvous(tenant, &names, &weights)
            }
            (None, None) => match pick::weighted(&weights, counter) {
                Some(first) => (0..candidates.len())
                    .map(|k| (first + k) % candidates.len())
                    .filter(|&i| weights[i] > 0)
                    .collect(),
                None => Vec::new(),
            },
        };
        if order.is_empty() {
            return Err(no_worker(reasons.join("; ")));
        }
        // The first choice first; a pool at its in-flight cap passes the request on to the
        // next in order, and all of them full is 503 `overloaded` (no queue).
        let mut slot = None;
        let mut chosen = None;
        for i in order {
            let pool = candidates[i];
            match &pool.in_flight {
                None => {
                    chosen = Some(pool);
                    break;
                }
                Some(limit) => {
                    if let Some(s) = limit.try_acquire() {
                        slot = Some(Arc::new(s));
                        chosen = Some(pool);
                        break;
                    }
                }
            }
        }
        let Some(pool) = chosen else {
            ::metrics::counter!(crate::metrics::LOAD_SHED_TOTAL, "ceiling" => "pool_in_flight")
                .increment(1);
            return Err(GatewayError::Overloaded {
                ceiling: "pool in-flight request",
            });
        };
        let target = pool
            .pick()
            .ok_or_else(|| no_worker(format!("pool `{}` lost its eligible workers", pool.name)))?;
        Ok(RoutePlan {
            pool: (*pool).clone(),
            target: Arc::new(target),
            slot,
        })
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

/// The tower predicate of the routing stage.
#[derive(Debug, Clone)]
pub struct Route {
    router: Arc<Router>,
}

impl Predicate<Request<Bytes>> for Route {
    type Request = Request<Bytes>;

    fn check(&mut self, mut request: Request<Bytes>) -> Result<Request<Bytes>, BoxError> {
        let parsed = request
            .extensions()
            .get::<InferenceRequest>()
            .ok_or_else(|| GatewayError::Internal("routing ran before parsing".into()))?;
        let admitted = request
            .extensions()
            .get::<AdmittedPools>()
            .map(|a| a.0.clone())
            .unwrap_or_else(|| Arc::from(Vec::new()));
        // Anonymous traffic has no tenant to stick to: split request by request.
        let tenant = request
            .extensions()
            .get::<AuthContext>()
            .filter(|a| &*a.tenant != crate::tenant::ANONYMOUS_TENANT)
            .map(|a| a.tenant.clone());
        let choice = request
            .extensions()
            .get::<PoolChoice>()
            .map(|c| c.0.clone());
        let plan = self
            .router
            .route(parsed, &admitted, tenant.as_deref(), choice.as_deref())?;
        request.extensions_mut().insert(plan);
        Ok(request)
    }
}

/// The routing stage as a layer.
pub type RouteLayer = FilterLayer<Route>;

impl Route {
    /// Route over `router`'s pools.
    pub fn layer(router: Arc<Router>) -> RouteLayer {
        FilterLayer::new(Route { router })
    }
}
