//! Each tenant's share of a pool's KV (issue 30): what it holds now against its weighted
//! fair share, and the room the pool keeps free for tenants below their share.
//!
//! Fair queuing alone orders the queue, but a full pool frees room only as answers end,
//! and answers of equal length end together: a light tenant at the head of the queue
//! still waits for the next wave of room, up to a whole answer's time. Under generalized
//! processor sharing a tenant using less than its share is never delayed by the others.
//! Approximating that on engines that cannot preempt means *keeping* room for it: while a
//! tenant below its fair share is active, the room it recently used and gave back (its
//! peak over the last [`RECENT`] less what it holds now, and at least one more request of
//! its size, never past its fair share) is held back for it alone: other tenants may not
//! take it. Its next request then finds room at once.
//!
//! - A tenant's fair share is the pool's KV × its weight ÷ the weights of the tenants
//!   active in the pool (holding KV, waiting, or active within [`RECENT`]).
//! - Only requests below their tenant's share may take the kept room (see
//!   `stack::routing::wait`); the total kept is capped by `[scheduling]
//!   fair_share_reserve` (a fraction of the pool), so tenants at their share always have
//!   the rest. An idle tenant's room is kept for [`RECENT`] at most.
//! - A tenant new to the pool has no recent use to keep: while some tenant is at or above
//!   its share, `[scheduling] newcomer_reserve` of the pool (in whole requests) is kept as
//!   *spare* room that any request below its tenant's share may take. A newcomer's first
//!   requests take it at once instead of waiting for the next wave of answers to end; from
//!   its first request on it keeps room of its own like any tenant below its share.
//!
//! Memory: one record per tenant active in the pool within [`RECENT`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod reserve;

pub use reserve::{keeps_fit, Reserve};

/// How long a tenant's recent use is remembered (and its room kept) after its last
/// request: long enough to span the gaps of a steady light tenant's arrivals.
pub const RECENT: Duration = Duration::from_secs(10);

/// The time constant of a tenant's average KV: a steady tenant's average hardly moves
/// between its arrivals, a burst counts in seconds.
const AVERAGE_OVER: Duration = Duration::from_secs(5);

/// The pool's account of tenants' KV; share it as `Arc<TenantShares>`.
#[derive(Debug, Default)]
pub struct TenantShares {
    tenants: Mutex<HashMap<Arc<str>, Share>>,
}

#[derive(Debug)]
struct Share {
    weight: u32,
    /// KV tokens its requests hold in the pool now.
    kv: u64,
    /// `kv` averaged over time ([`AVERAGE_OVER`]), as of `average_at`.
    average: f64,
    average_at: Instant,
    /// Its requests waiting in the pool's queue, and their KV tokens.
    waiting: u32,
    waiting_kv: u64,
    /// Its largest `kv` in the current and the previous half of [`RECENT`].
    peaks: [u64; 2],
    /// When the current half started.
    peak_since: Instant,
    /// Its latest request's cost.
    last_cost: u64,
    /// When it last held or asked for room.
    last_active: Instant,
    /// When it became active (its record was made): before [`AVERAGE_OVER`] has passed,
    /// its average still counts up from zero.
    since: Instant,
}

impl Share {
    fn new(weight: u32, now: Instant) -> Self {
        Self {
            weight: weight.max(1),
            kv: 0,
            average: 0.0,
            average_at: now,
            waiting: 0,
            waiting_kv: 0,
            peaks: [0; 2],
            peak_since: now,
            last_cost: 0,
            last_active: now,
            since: now,
        }
    }

    fn roll(&mut self, now: Instant) {
        let half = RECENT / 2;
        let elapsed = now.saturating_duration_since(self.peak_since);
        if elapsed >= RECENT {
            self.peaks = [self.kv, 0];
            self.peak_since = now;
        } else if elapsed >= half {
            self.peaks = [self.kv, self.peaks[0]];
            self.peak_since = now;
        }
        self.peaks[0] = self.peaks[0].max(self.kv);
    }

    /// Bring the average up to `now` (call before `kv` changes, and before reading it).
    fn settle(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.average_at).as_secs_f64();
        let alpha = 1.0 - (-dt / AVERAGE_OVER.as_secs_f64()).exp();
        self.average += alpha * (self.kv as f64 - self.average);
        self.average_at = now;
    }

    /// Below its fair share: on average it holds less, and nothing waits beyond its next
    /// request (the one its kept room is for). A steady light tenant stays below through
    /// the bursts of its own arrivals; a flood's queued requests put it above at once.
    fn below(&self, fair: u64, now: Instant) -> bool {
        let beyond_next = self.waiting_kv.saturating_sub(self.last_cost);
        self.used(now) + (beyond_next as f64) < fair as f64
    }

    /// What it holds, as its share counts it: its average, and for a tenant active for
    /// less than [`AVERAGE_OVER`] (its average still counts up from zero) at least what it
    /// holds now, so that tenants arriving together with bursts (closed loops of many
    /// streams) are not taken for light ones and keep no room from those that are.
    fn used(&self, now: Instant) -> f64 {
        if now.saturating_duration_since(self.since) < AVERAGE_OVER {
            self.average.max(self.kv as f64)
        } else {
            self.average
        }
    }

    fn peak(&self) -> u64 {
        self.peaks[0].max(self.peaks[1])
    }

    fn active(&self, now: Instant) -> bool {
        self.kv > 0 || self.waiting > 0 || now.saturating_duration_since(self.last_active) < RECENT
    }
}

impl TenantShares {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Share>> {
        self.tenants.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a new request of `tenant` is below its fair share of `capacity`: nothing of
    /// it waits, and what it held on average lately is less than its share. A tenant not
    /// seen lately is below.
    ///
    /// `waiting_already`: how many of the tenant's waiting requests are this request's own
    /// (1 when it queues again after losing its claim, else 0).
    pub fn under_share(
        &self,
        tenant: &Arc<str>,
        weight: u32,
        capacity: u64,
        waiting_already: u32,
    ) -> bool {
        let now = Instant::now();
        let mut tenants = self.lock();
        let mut total = active_weight(&tenants, now);
        match tenants.get_mut(tenant) {
            Some(share) => {
                if !share.active(now) {
                    total += u64::from(share.weight);
                }
                share.settle(now);
                // A new request goes ahead only when none of its tenant's waits already
                // (as fair queuing's sparse tenant): a burst queues behind its first.
                share.waiting <= waiting_already
                    && share.below(fair(capacity, share.weight, total), now)
            }
            None => fair(capacity, weight, total + u64::from(weight.max(1))) > 0,
        }
    }

    /// Count `cost` KV tokens held by `tenant` until the hold drops.
    pub fn hold(self: &Arc<Self>, tenant: Arc<str>, weight: u32, cost: u64) -> ShareHold {
        let now = Instant::now();
        {
            let mut tenants = self.lock();
            let share = tenants
                .entry(tenant.clone())
                .or_insert_with(|| Share::new(weight, now));
            share.weight = weight.max(1);
            share.settle(now);
            share.kv = share.kv.saturating_add(cost);
            share.last_cost = cost;
            share.last_active = now;
            share.roll(now);
        }
        ShareHold {
            shares: self.clone(),
            tenant,
            cost,
        }
    }

    /// Count one request of `tenant` waiting in the queue until the mark drops.
    pub fn waiting(self: &Arc<Self>, tenant: Arc<str>, weight: u32, cost: u64) -> WaitingMark {
        let now = Instant::now();
        {
            let mut tenants = self.lock();
            let share = tenants
                .entry(tenant.clone())
                .or_insert_with(|| Share::new(weight, now));
            share.waiting += 1;
            share.waiting_kv = share.waiting_kv.saturating_add(cost);
            share.last_cost = cost;
            share.last_active = now;
        }
        WaitingMark {
            shares: self.clone(),
            tenant,
            cost,
        }
    }

    /// The room to keep for tenants below their share of `capacity`, at most
    /// `max_fraction` of it, of which `spare_fraction` (in whole requests) for any request
    /// below its tenant's share while the pool is contended; tenants gone quiet for
    /// [`RECENT`] are forgotten.
    pub fn reserve(&self, capacity: u64, max_fraction: f64, spare_fraction: f64) -> Reserve {
        if max_fraction <= 0.0 || capacity == 0 {
            return Reserve::default();
        }
        let now = Instant::now();
        let mut tenants = self.lock();
        tenants.retain(|_, s| s.active(now));
        let total = active_weight(&tenants, now);
        let mut reserve = Reserve {
            cap: (capacity as f64 * max_fraction.min(1.0)) as u64,
            ..Reserve::default()
        };
        // The largest request of a tenant at or above its share: the pool is contended.
        let mut contended = 0u64;
        for (tenant, share) in tenants.iter_mut() {
            share.roll(now);
            share.settle(now);
            let fair = fair(capacity, share.weight, total);
            if share.last_cost == 0 {
                continue;
            }
            if !share.below(fair, now) {
                contended = contended.max(share.last_cost);
                continue;
            }
            // The room it used lately and gave back, and one more request of its size (its
            // arrivals jitter past its peak; a newcomer's next request comes before its
            // peak means anything); never past its fair share.
            let want = share.peak().max(share.kv.saturating_add(share.last_cost));
            let keep = want.min(fair).saturating_sub(share.kv);
            if keep > 0 {
                reserve.keeps.push((tenant.clone(), keep));
                reserve.slot = reserve.slot.max(share.last_cost);
            }
        }
        if contended > 0 && spare_fraction > 0.0 {
            // Spare room for a tenant without history, in whole requests of the size the
            // contending tenants send (a newcomer's own size is not known yet).
            let requests = (capacity as f64 * spare_fraction.min(1.0) / contended as f64) as u64;
            if requests > 0 {
                reserve.spare = requests.saturating_mul(contended);
                reserve.slot = reserve.slot.max(contended);
            }
        }
        reserve
    }

    /// Tenants tracked (for tests and the status page).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no tenant is tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn active_weight(tenants: &HashMap<Arc<str>, Share>, now: Instant) -> u64 {
    tenants
        .values()
        .filter(|s| s.active(now))
        .map(|s| u64::from(s.weight))
        .sum::<u64>()
        .max(1)
}

fn fair(capacity: u64, weight: u32, total_weight: u64) -> u64 {
    ((u128::from(capacity) * u128::from(weight.max(1))) / u128::from(total_weight.max(1))) as u64
}

/// A tenant's KV held in the pool; given back on drop.
#[derive(Debug)]
pub struct ShareHold {
    shares: Arc<TenantShares>,
    tenant: Arc<str>,
    cost: u64,
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut tenants = self.shares.lock();
        if let Some(share) = tenants.get_mut(&self.tenant) {
            share.roll(now);
            share.settle(now);
            share.kv = share.kv.saturating_sub(self.cost);
            share.last_active = now;
        }
    }
}

/// A tenant's request waiting in the pool's queue; unmarked on drop.
#[derive(Debug)]
pub struct WaitingMark {
    shares: Arc<TenantShares>,
    tenant: Arc<str>,
    cost: u64,
}

impl Drop for WaitingMark {
    fn drop(&mut self) {
        let mut tenants = self.shares.lock();
        if let Some(share) = tenants.get_mut(&self.tenant) {
            share.waiting = share.waiting.saturating_sub(1);
            share.waiting_kv = share.waiting_kv.saturating_sub(self.cost);
        }
    }
}

#[cfg(test)]
mod tests;
