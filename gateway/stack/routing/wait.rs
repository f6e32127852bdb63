//! Waiting for room (issue 30): when no worker of the chosen pool has KV room for a
//! request, it waits in the pool's gateway queue ([`crate::fleet::FairQueue`]) instead of
//! being pushed into an engine's backlog or refused at once.
//!
//! - A newcomer never overtakes a non-empty queue: it joins behind the requests already
//!   waiting, so a flooding tenant cannot take freed room ahead of a light tenant's queued
//!   request.
//! - Whoever waits listens for freed room (a load guard dropped, an engine reporting more
//!   room) and then *pumps* the queue: heads are released in the queue's order (class,
//!   then weighted-fair finish time) while a worker's room, counted down as they are
//!   released, still fits them. A released request then takes its workers atomically
//!   ([`super::take::claim_with_room`]): kvgate never promises an engine more KV than its
//!   pool × `kv_overcommit`. One that loses that race (another release took the room) queues
//!   again with the same deadline.
//! - A request waits at most `[scheduling] queue_timeout`, and never past the client's own
//!   timeout when it says it (`x-stainless-timeout`, seconds, as the OpenAI SDKs send).
//! - `[scheduling] enabled = false`, or a request no worker could hold even when empty,
//!   takes today's path: the least outstanding worker, and the engine queues it.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::affinity::Affinity;
use super::pick::{could_ever_fit, holding_workers};
use super::take::{claim_with_room, pick_workers};
use super::Target;
use crate::audit::AuditLog;
use crate::config::{Priority, SchedulingConfig};
use crate::fleet::{KvCost, Pool, QueueEntry, QueueRefusal};
use crate::metrics;

/// `[scheduling]` as routing applies it (taken per generation: a reload changes it for the
/// requests that come after).
#[derive(Debug, Clone, Copy)]
pub struct Scheduling {
    pub enabled: bool,
    pub queue_timeout: Duration,
    pub overcommit: f64,
}

impl Scheduling {
    /// From the config's `[scheduling]`.
    pub fn from_config(config: &SchedulingConfig) -> Self {
        Self {
            enabled: config.enabled,
            queue_timeout: config.queue_timeout,
            overcommit: config.kv_overcommit,
        }
    }
}

impl Default for Scheduling {
    fn default() -> Self {
        Self::from_config(&SchedulingConfig::default())
    }
}

/// Who waits: the queue orders by its tenant, weight and class; a refusal's audit line
/// names it.
#[derive(Debug, Clone)]
pub struct Waiter {
    pub tenant: Arc<str>,
    pub weight: u32,
    pub class: Priority,
    /// The client's own timeout, when it says it.
    pub client_timeout: Option<Duration>,
    pub request_id: Option<String>,
}

/// The workers a request got, and how long it waited in the queue for them.
#[derive(Debug)]
pub struct Claimed {
    pub target: Target,
    /// None: it did not queue.
    pub waited: Option<Duration>,
}

/// Why a request got no workers.
#[derive(Debug)]
pub enum Unclaimed {
    /// The pool has no eligible worker at all.
    NoEligibleWorker,
    /// The queue gave it no turn; retry after `retry_after` (from the queue's drain rate).
    Refused {
        reason: QueueRefusal,
        retry_after: Duration,
    },
}

/// The workers of `pool` for a request costing `cost`: at once where it fits, else after
/// waiting its turn in the pool's queue (see the module docs); among the workers that fit,
/// the one holding the prompt's prefix first when there is an `affinity` (it never makes a
/// request wait). `waiter` says who waits; it is asked only when the request queues (the
/// common path allocates nothing for it).
pub async fn claim(
    pool: &Arc<Pool>,
    cost: KvCost,
    scheduling: Scheduling,
    affinity: Option<&Affinity<'_>>,
    waiter: impl FnOnce() -> Waiter,
    audit: &AuditLog,
) -> Result<Claimed, Unclaimed> {
    let overcommit = scheduling.overcommit;
    if !scheduling.enabled || !could_ever_fit(pool, cost, overcommit) {
        return pick_workers(pool, cost, overcommit, affinity)
            .map(|target| Claimed {
                target,
                waited: None,
            })
            .ok_or(Unclaimed::NoEligibleWorker);
    }
    if pool.queue.is_empty() && pool.promised.total() == 0 {
        if let Some(target) = claim_with_room(pool, cost, overcommit, affinity) {
            return Ok(Claimed {
                target,
                waited: None,
            });
        }
    }
    let waiter = &waiter();
    let timeout = waiter.client_timeout.map_or(scheduling.queue_timeout, |c| {
        c.min(scheduling.queue_timeout)
    });
    let deadline = Instant::now() + timeout;
    let started = Instant::now();
    loop {
        let entry = QueueEntry {
            tenant: waiter.tenant.clone(),
            weight: waiter.weight,
            class: waiter.class,
            cost: cost.total,
            deadline,
        };
        let mut ticket = match pool.queue.join(entry) {
            Ok(ticket) => ticket,
            Err(reason) => return Err(refused(pool, waiter, reason, started, audit)),
        };
        publish_depth(pool);
        let turn = loop {
            // Listen before pumping, so room freed meanwhile is not missed.
            let freed = pool.room_freed().notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            pump(pool, overcommit);
            tokio::select! {
                biased;
                turn = ticket.turn() => break turn,
                () = &mut freed => {}
            }
        };
        publish_depth(pool);
        match turn {
            Ok(()) => {
                let claimed = claim_with_room(pool, cost, overcommit, affinity);
                // Claimed (now in the worker's account) or lost: either way the promise
                // ends, after the claim (see `fleet::Promised`); a pump that counted both
                // released less than it could, so the others pump again.
                pool.promised.settle(cost.total);
                if !pool.queue.is_empty() {
                    pool.room_freed().notify_waiters();
                }
                if let Some(target) = claimed {
                    let waited = started.elapsed();
                    ::metrics::histogram!(
                        metrics::QUEUE_WAIT_SECONDS,
                        "pool" => pool.name.to_string(),
                        "class" => waiter.class.as_str()
                    )
                    .record(waited.as_secs_f64());
                    return Ok(Claimed {
                        target,
                        waited: Some(waited),
                    });
                }
                // Another release took the room first: queue again, same deadline.
                if Instant::now() >= deadline {
                    let reason = QueueRefusal::TimedOut;
                    return Err(refused(pool, waiter, reason, started, audit));
                }
            }
            Err(reason) => return Err(refused(pool, waiter, reason, started, audit)),
        }
    }
}

/// Release the queue's heads in order while a worker's room fits them, counting the room
/// down as they go (each then claims for itself, atomically).
fn pump(pool: &Pool, overcommit: f64) {
    let _one_pump = pool.promised.pumping();
    // The promises first, then the room (see `fleet::Promised`).
    let mut owed = pool.promised.total();
    let mut rooms: Vec<u64> = holding_workers(pool)
        .iter()
        .filter(|w| w.is_eligible())
        .filter_map(|w| w.room(overcommit))
        .collect();
    // Promised room is taken from the largest rooms first, as those claims will take them.
    rooms.sort_unstable_by(|a, b| b.cmp(a));
    for room in rooms.iter_mut() {
        let taken = owed.min(*room);
        *room -= taken;
        owed -= taken;
    }
    pool.queue.release(
        |cost| match rooms.iter_mut().filter(|r| **r >= cost).max_by_key(|r| **r) {
            Some(room) => {
                *room -= cost;
                pool.promised.add(cost);
                true
            }
            None => false,
        },
    );
}

/// The queue's depth by class, as a gauge.
fn publish_depth(pool: &Pool) {
    for (class, n) in pool.queue.snapshot().by_class {
        ::metrics::gauge!(
            metrics::QUEUE_DEPTH,
            "pool" => pool.name.to_string(),
            "class" => class.as_str()
        )
        .set(n as f64);
    }
}

/// Count, log and audit a refusal; the client is told when to come back.
fn refused(
    pool: &Pool,
    waiter: &Waiter,
    reason: QueueRefusal,
    started: Instant,
    audit: &AuditLog,
) -> Unclaimed {
    let retry_after = pool.queue.retry_after();
    let waited = started.elapsed();
    ::metrics::counter!(
        metrics::QUEUE_REFUSALS_TOTAL,
        "pool" => pool.name.to_string(),
        "tenant" => waiter.tenant.to_string(),
        "class" => waiter.class.as_str(),
        "reason" => reason.as_str()
    )
    .increment(1);
    let mut fields = serde_json::Map::new();
    fields.insert("pool".into(), pool.name.to_string().into());
    fields.insert("tenant".into(), waiter.tenant.to_string().into());
    fields.insert("class".into(), waiter.class.as_str().into());
    fields.insert("reason".into(), reason.as_str().into());
    fields.insert("waited_ms".into(), (waited.as_millis() as u64).into());
    fields.insert(
        "retry_after_seconds".into(),
        retry_after.as_secs_f64().ceil().into(),
    );
    if let Some(id) = &waiter.request_id {
        fields.insert("request_id".into(), id.clone().into());
    }
    audit.record("queue_refused", fields);
    Unclaimed::Refused {
        reason,
        retry_after,
    }
}
