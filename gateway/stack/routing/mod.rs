//! Routing: which pool and which workers of the fleet serve one request.
//!
//! A model's pools share its traffic by weight (canary rollouts). The split is sticky per
//! tenant ([`pick::rendezvous`]): while weights stand still a tenant's requests all land on
//! one pool, so a conversation is not spread over two engine versions; when weights change
//! only the tenants at the moving edge move. Anonymous traffic has no tenant to stick to
//! and is split request by request. A tenant with `choose_pool` may name a pool with
//! `x-kvgate-pool` (even at weight 0: a canary tried by hand). Inside a pool the eligible
//! worker with the most KV room for the request is picked, per role (least outstanding
//! requests when none has room; see [`pick`]). Only eligible workers (known capacity, a new
//! enough engine, not draining; I3) are ever chosen.
//!
//! The pools and workers themselves — capacity, health, ejection, drains — are the
//! fleet's ([`crate::fleet`]); this stage only chooses among them.
//!
//! When no worker of the chosen pool has room, the request waits its turn in the pool's
//! gateway queue (weighted-fair across tenants within priority classes; see `wait`).
//!
//! Inside the pool, a worker recently sent the longest prefix of the prompt goes first
//! (`[prefix_routing]`, see `affinity`) unless it is busier than the least loaded by the
//! configured margin.
//!
//! Reads: `InferenceRequest`, `AdmittedPools`, `AuthContext`, `PoolChoice`, `RequestCost`
//! (the request's KV cost), `RequestBlocks` (its prompt's KV blocks), `RequestPriority`,
//! `RequestId`. Writes: the [`RoutePlan`]
//! extension, whose worker loads live until the response body ends; a request that waited
//! answers with `x-kvgate-queued-ms`.

mod affinity;
pub mod blocks;
mod pick;
mod route;
mod take;
mod wait;

pub use affinity::{Affinity, Outcome, Preference, PrefixRouting};
pub use route::{Route, RouteLayer};
pub use take::{pick_other_unified, pick_workers};
pub use wait::{Claimed, Scheduling, Sharer, Unclaimed, Waiter};

use futures_util::future::BoxFuture;
use std::sync::Arc;

use crate::error::GatewayError;
use crate::fleet::{retry_after, Fleet, KvCost, Pool, ShareHold, Worker, WorkerLoad};
use crate::load::InFlightSlot;
use crate::stack::api::InferenceRequest;

/// The header naming the pool a tenant with `choose_pool` wants.
pub const POOL_CHOICE_HEADER: &str = "x-kvgate-pool";

/// The pool the client chose with `x-kvgate-pool` (written by tenant rules, once allowed).
#[derive(Debug, Clone)]
pub struct PoolChoice(pub Arc<str>);

/// The worker a request must be served by (set by `stack::responses`: a stored response
/// lives in that one engine process): routing takes that worker or none, dispatch never
/// retries elsewhere.
#[derive(Debug, Clone)]
pub struct PinnedWorker {
    pub pool: Arc<str>,
    /// The worker's `host:port`.
    pub authority: String,
    /// The stored response's id.
    pub response_id: String,
}

/// The pools a request was admitted to (never empty; written by admission); routing
/// picks among them.
#[derive(Debug, Clone)]
pub struct AdmittedPools(pub Arc<[Arc<str>]>);

/// What a request will hold in its workers' KV, as admission knows it (admission's
/// `TokenCount` implements it: the exact prompt once counted, else its bound, plus the new
/// tokens allowed). A trait so this stage needs nothing of admission's.
pub trait KvCostEstimate: Send + Sync + std::fmt::Debug {
    /// The cost now (never waits for a count in progress).
    fn kv_cost(&self) -> KvCost;
}

/// The request's [`KvCostEstimate`] (written by admission next to `AdmittedPools`);
/// routing claims workers for it. Absent: cost 0.
#[derive(Debug, Clone)]
pub struct RequestCost(pub Arc<dyn KvCostEstimate>);

/// A request's prompt as KV blocks, as admission computes it (its token ids hashed into
/// chained block hashes, [`blocks::chain`]). A trait so this stage needs nothing of
/// admission's.
pub trait BlockChain: Send + Sync + std::fmt::Debug {
    /// The chained hashes of the full blocks of the request's (first) prompt, in order;
    /// waits while they are computed off the async threads. None when there are none to
    /// be had (the tokenizer failed, or no thread was free to compute them).
    fn chain(&self) -> BoxFuture<'static, Option<Arc<[u64]>>>;
}

/// A tenant's prefix-cache partition as the engines see it: isolation's `CacheSalter`
/// derives the tenant's salt from a secret, and this is that salt as a seed for the
/// tenant's block keys ([`blocks::seeded`]). A trait so this stage needs nothing of
/// isolation's.
pub trait CachePartitions: Send + Sync + std::fmt::Debug {
    /// The partition of `tenant` on pools that send it its salt.
    fn partition(&self, tenant: &str) -> u64;
}

/// The request's [`BlockChain`] (written by admission for requests to pools that route by
/// prefix, `[prefix_routing]`); routing prefers the worker holding their longest prefix.
/// Absent: by load only.
#[derive(Debug, Clone)]
pub struct RequestBlocks(pub Arc<dyn BlockChain>);

/// The workers chosen for one request; their loads end with the response body.
#[derive(Debug)]
pub enum Target {
    Unified(WorkerLoad),
    Disaggregated {
        prefill: WorkerLoad,
        decode: WorkerLoad,
    },
}

impl Target {
    /// The KV its request-holding worker (unified or decode) was charged for it.
    pub fn held_kv(&self) -> u64 {
        match self {
            Target::Unified(load) => load.kv(),
            Target::Disaggregated { decode, .. } => decode.kv(),
        }
    }
}

/// The route chosen for one request.
#[derive(Debug, Clone)]
pub struct RoutePlan {
    pub pool: Arc<Pool>,
    /// The chosen workers; shared so the plan can be cloned into the response body guard.
    pub target: Arc<Target>,
    /// The pool's in-flight slot (pools with `max_in_flight`), held until the body ends.
    pub slot: Option<Arc<InFlightSlot>>,
    /// The request's KV cost, held on its workers (a retry claims the same).
    pub cost: KvCost,
    /// `[scheduling] kv_overcommit` the workers were claimed under (a retry uses it too).
    pub overcommit: f64,
    /// The tenant's KV counted against its fair share of the pool, until the body ends.
    pub share: Option<Arc<ShareHold>>,
    /// The prompt's block keys in the pool's cache partition, when the pool chooses by
    /// prefix: a retry on another worker is remembered in the pool's index too.
    pub prefix_keys: Option<Arc<[u64]>>,
    /// Pinned to its worker (a stored response lives there): never retried elsewhere.
    pub pinned: bool,
}

/// Which workers served a request (a response extension set by dispatch): the audit
/// names them, and the request's outcome counts for their outlier ejection.
#[derive(Debug, Clone)]
pub struct ServedBy {
    /// The unified or decode worker.
    pub worker: Arc<Worker>,
    pub prefill: Option<Arc<Worker>>,
}

/// A pool chosen for one request, with its in-flight slot (pools with `max_in_flight`).
#[derive(Debug)]
pub struct ChosenPool {
    pub pool: Arc<Pool>,
    pub slot: Option<Arc<InFlightSlot>>,
}

/// The 503 when `pool` has no eligible worker left for `request`.
pub fn no_eligible_worker(
    fleet: &Fleet,
    request: &InferenceRequest,
    reason: String,
) -> GatewayError {
    GatewayError::NoEligibleWorker {
        model: request.model.clone(),
        reason,
        retry_after: retry_after(fleet.pools_of(&request.model)),
    }
}

/// Choose a pool of `fleet` among those able to serve `request` — the chosen one, else by
/// weight, sticky per `tenant` when there is one — and take its in-flight slot; the stage
/// then claims its workers (at once, or after a turn in the pool's queue: see `wait`).
/// `admitted` (when not empty) limits the choice to the pools admission let through.
pub fn choose_pool(
    fleet: &Fleet,
    request: &InferenceRequest,
    admitted: &[Arc<str>],
    tenant: Option<&str>,
    choice: Option<&str>,
) -> Result<ChosenPool, GatewayError> {
    let no_worker = |reason: String| no_eligible_worker(fleet, request, reason);
    let Some((pools, counter)) = fleet.model(&request.model) else {
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
            match pool.refusal_for(
                request.endpoint.engine_needs().sglang,
                request.endpoint.engine_needs().unified,
                choice.is_some(),
            ) {
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
    Ok(ChosenPool {
        pool: (*pool).clone(),
        slot,
    })
}
