//! Taking a pool's workers for one request, role by role: the unified or decode worker
//! (holding the whole request) and, in a PD pool, a prefill worker (holding the prompt until
//! its leg hands the KV to decode), each by the rules of `pick.rs` — only within room
//! (`[scheduling]`), or the most room else the least outstanding.
//!
//! With an [`Affinity`] (`[prefix_routing]`), the unified or prefill worker holding the
//! longest prefix of the prompt is tried first among the workers those rules could take
//! (`affinity.rs`); the decode worker is chosen by load.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::affinity::{Affinity, Outcome};
use super::pick::{claim_best, claim_fitting};
use super::Target;
use crate::fleet::{KvCost, Pool, PoolWorkers, Role, Worker, WorkerLoad};

/// The workers of `pool` for `cost`, only where it fits in their room now (most room
/// first, or the prefix's worker first with an `affinity`), each taken atomically
/// ([`Worker::claim_within`]): None when no worker of a role has room.
pub fn claim_with_room(
    pool: &Pool,
    cost: KvCost,
    overcommit: f64,
    affinity: Option<&Affinity<'_>>,
) -> Option<Target> {
    take_workers(pool, cost, overcommit, Claim::WithinRoom, affinity)
}

/// How a role's worker is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// Only where the request fits in the worker's room now ([`claim_fitting`]).
    WithinRoom,
    /// The most room, else the least outstanding ([`claim_best`]).
    Best,
}

impl Claim {
    /// The best worker of `workers` by this rule, taken.
    fn any(
        self,
        workers: &[Arc<Worker>],
        cursor: &AtomicUsize,
        cost: u64,
        overcommit: f64,
    ) -> Option<WorkerLoad> {
        match self {
            Claim::WithinRoom => claim_fitting(workers, cursor, cost, overcommit),
            Claim::Best => claim_best(workers, cursor, cost, overcommit),
        }
    }

    /// `worker` itself, taken by this rule (None: it is not free to take now).
    fn this(self, worker: &Arc<Worker>, cost: u64, overcommit: f64) -> Option<WorkerLoad> {
        match self {
            Claim::WithinRoom => worker.claim_within(cost, overcommit),
            Claim::Best => worker.claim(cost),
        }
    }

    /// The room a candidate needs under this rule (None: any eligible worker will do).
    fn need(self, cost: u64) -> Option<u64> {
        (self == Claim::WithinRoom).then_some(cost)
    }
}

/// The unified or decode worker (holding `cost.total`) and, in a PD pool, a prefill worker
/// (holding `cost.prompt`: its leg hands the KV to decode), each taken by `claim`; the
/// unified or prefill one by the prompt's prefix first when there is an `affinity`.
fn take_workers(
    pool: &Pool,
    cost: KvCost,
    overcommit: f64,
    claim: Claim,
    affinity: Option<&Affinity<'_>>,
) -> Option<Target> {
    match &pool.workers {
        PoolWorkers::Unified(ws) => Some(Target::Unified(by_prefix(
            ws,
            pool.cursor(Role::Unified),
            cost.total,
            overcommit,
            claim,
            affinity,
        )?)),
        PoolWorkers::Disaggregated { prefill, decode } => {
            // The decode side first: it holds the whole request (a prefill load taken
            // first would be given back at once when decode is full).
            let decode = claim.any(decode, pool.cursor(Role::Decode), cost.total, overcommit)?;
            let prefill = by_prefix(
                prefill,
                pool.cursor(Role::Prefill),
                cost.prompt,
                overcommit,
                claim,
                affinity,
            )?;
            Some(Target::Disaggregated { prefill, decode })
        }
    }
}

/// A worker of `workers` taken by `claim`, the prefix's preferred worker first; the choice
/// is remembered in the pool's prefix index.
fn by_prefix(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    cost: u64,
    overcommit: f64,
    claim: Claim,
    affinity: Option<&Affinity<'_>>,
) -> Option<WorkerLoad> {
    let Some(affinity) = affinity else {
        return claim.any(workers, cursor, cost, overcommit);
    };
    let preference = affinity.prefer(workers, claim.need(cost), overcommit);
    let preferred = preference
        .worker
        .as_ref()
        .and_then(|w| claim.this(w, cost, overcommit));
    let (load, outcome) = match preferred {
        Some(load) => (load, preference.outcome),
        None => {
            let load = claim.any(workers, cursor, cost, overcommit)?;
            // A preferred worker another request took meanwhile: balanced by load.
            let outcome = match preference.outcome {
                Outcome::Hit => Outcome::Balanced,
                other => other,
            };
            (load, outcome)
        }
    };
    affinity.taken(load.worker(), &preference, outcome);
    Some(load)
}

/// Choose the workers of `pool` for one request costing `cost` KV tokens (most room, then
/// least outstanding, round-robin on ties; the prefix's worker first with an `affinity`).
/// The unified or decode worker holds `cost.total`, a prefill worker `cost.prompt` (its leg
/// hands the KV to decode).
pub fn pick_workers(
    pool: &Pool,
    cost: KvCost,
    overcommit: f64,
    affinity: Option<&Affinity<'_>>,
) -> Option<Target> {
    take_workers(pool, cost, overcommit, Claim::Best, affinity)
}

/// Another eligible worker of a unified `pool` than `failed` (a retry after a connect
/// failure) for the same `cost`, chosen by load as [`pick_workers`] does; a request routed
/// by prefix (`prefix_keys`) is remembered there in the pool's index.
pub fn pick_other_unified(
    pool: &Pool,
    failed: &Worker,
    cost: KvCost,
    overcommit: f64,
    prefix_keys: Option<&Arc<[u64]>>,
) -> Option<Target> {
    let PoolWorkers::Unified(ws) = &pool.workers else {
        return None;
    };
    let others: Vec<Arc<Worker>> = ws
        .iter()
        .filter(|w| w.authority != failed.authority)
        .cloned()
        .collect();
    let load = claim_best(&others, pool.cursor(Role::Unified), cost.total, overcommit)?;
    if let Some(keys) = prefix_keys {
        super::affinity::taken_instead(pool, load.worker(), keys);
    }
    Some(Target::Unified(load))
}
