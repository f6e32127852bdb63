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
use super::pick::could_ever_fit;
use super::take::{claim_with_room, pick_workers};
use super::Target;
use crate::audit::AuditLog;
use crate::config::{Priority, SchedulingConfig};
use crate::fleet::{keeps_fit, Head, KvCost, Pool, QueueEntry, QueueRefusal, Reserve, ShareHold};
use crate::metrics;

/// `[scheduling]` as routing applies it (taken per generation: a reload changes it for the
/// requests that come after).
#[derive(Debug, Clone, Copy)]
pub struct Scheduling {
    pub enabled: bool,
    pub queue_timeout: Duration,
    pub overcommit: f64,
    /// `fair_share_reserve`: the most of a pool kept for tenants below their share.
    pub reserve: f64,
    /// `newcomer_reserve`: the part of it kept spare, for tenants without history.
    pub newcomer_reserve: f64,
    /// Tenants in the config (None: not said; counted as several).
    pub tenants: Option<usize>,
}

impl Scheduling {
    /// From the config's `[scheduling]`.
    pub fn from_config(config: &SchedulingConfig) -> Self {
        Self {
            enabled: config.enabled,
            queue_timeout: config.queue_timeout,
            overcommit: config.kv_overcommit,
            reserve: config.fair_share_reserve,
            newcomer_reserve: config.newcomer_reserve,
            tenants: None,
        }
    }

    /// With the config's number of tenants: a pool only one tenant may use keeps no spare
    /// room for newcomers (none can come).
    pub fn with_tenants(self, tenants: usize) -> Self {
        Self {
            tenants: Some(tenants),
            ..self
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
    /// Its KV counted against its tenant's fair share (None with scheduling off).
    pub share: Option<ShareHold>,
}

/// The tenant a request counts against, and its weight.
#[derive(Debug, Clone)]
pub struct Sharer {
    pub tenant: Arc<str>,
    pub weight: u32,
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
    sharer: &Sharer,
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
                share: None,
            })
            .ok_or(Unclaimed::NoEligibleWorker);
    }
    // The tenant's share counts what its request was charged (a slot's share at least).
    let hold = |target: &Target| {
        let Sharer { tenant, weight } = sharer.clone();
        Some(pool.shares.hold(tenant, weight, target.held_kv()))
    };
    // The pool's KV that fair shares divide, read once per request.
    let capacity = pool.kv_capacity(overcommit);
    if pool.queue.is_empty() && pool.promised.total() == 0 {
        if let Some(target) = claim_with_room(pool, cost, overcommit, affinity) {
            // Checked after the claim, so that concurrent claims see each other: one that
            // took room kept for another tenant gives it back and queues.
            if kept_room_intact(pool, sharer, scheduling, capacity) {
                let share = hold(&target);
                return Ok(Claimed {
                    target,
                    waited: None,
                    share,
                });
            }
        }
    }
    // Only a request that queues needs to know whether it goes ahead.
    let mut under_share = under_share(pool, sharer, scheduling, capacity, 0);
    let waiter = &waiter();
    let timeout = waiter.client_timeout.map_or(scheduling.queue_timeout, |c| {
        c.min(scheduling.queue_timeout)
    });
    let deadline = Instant::now() + timeout;
    let started = Instant::now();
    // Queued, it counts as charged where it is cheapest (its slot's share at least, in the
    // units its tenant's holds are counted in): the queue's order, its tenant's waiting KV
    // and the promise the pump makes all use this one number.
    let queued = pool.least_charge(cost.total, overcommit);
    // Its tenant counts as active (for fair shares) while it waits.
    let _waiting = pool
        .shares
        .waiting(sharer.tenant.clone(), sharer.weight, queued);
    loop {
        let entry = QueueEntry {
            tenant: waiter.tenant.clone(),
            weight: waiter.weight,
            class: waiter.class,
            cost: queued,
            deadline,
            under_share,
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
            pump(pool, scheduling);
            tokio::select! {
                biased;
                turn = ticket.turn() => break turn,
                () = &mut freed => {}
            }
        };
        publish_depth(pool);
        // An older generation's queue is not closed by the drain: its waiters see the flag.
        let turn = match turn {
            Ok(()) if pool.is_draining() => {
                pool.promised.settle(queued);
                Err(QueueRefusal::Draining)
            }
            other => other,
        };
        match turn {
            Ok(()) => {
                let claimed = claim_with_room(pool, cost, overcommit, affinity);
                // Claimed (now in the worker's account) or lost: either way the promise
                // ends, after the claim (see `fleet::Promised`); a pump that counted both
                // released less than it could, so the others pump again.
                pool.promised.settle(queued);
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
                    let share = hold(&target);
                    return Ok(Claimed {
                        target,
                        waited: Some(waited),
                        share,
                    });
                }
                // Another release took the room first: queue again, same deadline.
                under_share = self::under_share(pool, sharer, scheduling, capacity, 1);
                if Instant::now() >= deadline {
                    let reason = QueueRefusal::TimedOut;
                    return Err(refused(pool, waiter, reason, started, audit));
                }
            }
            Err(reason) => return Err(refused(pool, waiter, reason, started, audit)),
        }
    }
}

/// Whether the request's tenant is below its fair share of `pool` (`fleet::share`).
fn under_share(
    pool: &Pool,
    sharer: &Sharer,
    scheduling: Scheduling,
    capacity: u64,
    own_waiting: u32,
) -> bool {
    if scheduling.reserve <= 0.0 {
        return false;
    }
    pool.shares
        .under_share(&sharer.tenant, sharer.weight, capacity, own_waiting)
}

/// Whether the room kept for the tenants below their share, other than `sharer`'s own
/// (and the spare, unless `sharer` is below its share), is still free
/// ([`crate::fleet::TenantShares`]).
fn kept_room_intact(pool: &Pool, sharer: &Sharer, scheduling: Scheduling, capacity: u64) -> bool {
    let reserve = reserve(pool, scheduling, capacity);
    if reserve.is_empty() {
        return true;
    }
    let under_share = under_share(pool, sharer, scheduling, capacity, 0);
    let rooms = rooms(pool, scheduling.overcommit);
    keeps_fit(
        rooms.iter().map(|r| &r.free),
        reserve.kept_from(&sharer.tenant, under_share),
        reserve.slot,
    )
}

/// The room `pool` keeps now for tenants below their share: spare room for newcomers
/// only where another tenant may come (the pool's own tenant list, else the config's).
fn reserve(pool: &Pool, scheduling: Scheduling, capacity: u64) -> Reserve {
    let tenants = pool
        .tenants
        .as_ref()
        .map(|t| t.len())
        .or(scheduling.tenants);
    let spare = if tenants.is_none_or(|n| n > 1) {
        scheduling.newcomer_reserve
    } else {
        0.0
    };
    pool.shares.reserve(capacity, scheduling.reserve, spare)
}

/// One worker's room as the pump counts it down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Room {
    free: u64,
    /// One running slot's share of its KV: the least a request is charged there (0: its
    /// slots are unknown; `fleet/worker/slots.rs`).
    slot: u64,
}

impl Room {
    fn charge(self, cost: u64) -> u64 {
        cost.max(self.slot)
    }
}

/// The eligible request-holding workers' room, less the room promised to released
/// requests (taken from the largest rooms first, as their claims will).
fn rooms(pool: &Pool, overcommit: f64) -> Vec<Room> {
    let mut owed = pool.promised.total();
    let mut rooms: Vec<Room> = pool
        .holding_workers()
        .iter()
        .filter(|w| w.is_eligible())
        .filter_map(|w| {
            Some(Room {
                free: w.room(overcommit)?,
                slot: w.slot_tokens(overcommit).unwrap_or(0),
            })
        })
        .collect();
    rooms.sort_unstable_by(|a, b| b.free.cmp(&a.free));
    for room in rooms.iter_mut() {
        let taken = owed.min(room.free);
        room.free -= taken;
        owed -= taken;
    }
    rooms
}

/// Count `head` into the roomiest worker of `rooms` that fits it as charged there,
/// leaving the room kept for the other tenants (in whole slots; a tenant's own kept room
/// is its to take, the spare any request's below its share). False: it does not fit.
fn take(rooms: &mut [Room], head: &Head, reserve: &Reserve) -> bool {
    let Some(i) = (0..rooms.len())
        .filter(|&i| rooms[i].free >= rooms[i].charge(head.cost))
        .max_by_key(|&i| rooms[i].free)
    else {
        return false;
    };
    let charge = rooms[i].charge(head.cost);
    rooms[i].free -= charge;
    let keep = reserve.kept_from(&head.tenant, head.under_share);
    if !keeps_fit(rooms.iter().map(|r| &r.free), keep, reserve.slot) {
        rooms[i].free += charge;
        return false;
    }
    true
}

/// Release the queue's heads in order while a worker's room fits them, counting the room
/// down as they go (each then claims for itself, atomically). Heads whose tenants are at or
/// above their share leave the room kept for those below.
fn pump(pool: &Pool, scheduling: Scheduling) {
    let _one_pump = pool.promised.pumping();
    let capacity = pool.kv_capacity(scheduling.overcommit);
    let reserve = reserve(pool, scheduling, capacity);
    // The promises first, then the room (see `fleet::Promised`).
    let mut rooms = rooms(pool, scheduling.overcommit);
    let mut release = |head: &Head| {
        let fits = take(&mut rooms, head, &reserve);
        if fits {
            pool.promised.add(head.cost);
        }
        fits
    };
    pool.queue.release_with(&mut release);
    // Past a head that does not fit, a request may still take its own tenant's kept room,
    // or the spare when it is below its share.
    if !reserve.is_empty() {
        let may_pass = |head: &Head| reserve.may_pass(&head.tenant, head.under_share);
        pool.queue.release_own(may_pass, &mut release);
    }
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
    let retry_after = match reason {
        // Another replica or generation answers at once: not the queue's pace.
        QueueRefusal::Draining | QueueRefusal::Closed => reason.retry_after(),
        _ => pool.queue.retry_after(),
    };
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

#[cfg(test)]
mod tests;
