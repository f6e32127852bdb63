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
    /// Since when it has been active without a pause of [`RECENT`].
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
    fn below(&self, fair: u64) -> bool {
        let beyond_next = self.waiting_kv.saturating_sub(self.last_cost);
        self.average + (beyond_next as f64) < fair as f64
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
                share.waiting <= waiting_already && share.below(fair(capacity, share.weight, total))
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
    /// `max_fraction` of it; tenants gone quiet for [`RECENT`] are forgotten.
    pub fn reserve(&self, capacity: u64, max_fraction: f64) -> Reserve {
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
        for (tenant, share) in tenants.iter_mut() {
            share.roll(now);
            share.settle(now);
            let fair = fair(capacity, share.weight, total);
            if share.last_cost == 0 || !share.below(fair) {
                continue;
            }
            // The room it used lately and gave back, and, for a steady tenant (active for
            // [`AVERAGE_OVER`]), one more request of its size (its arrivals jitter past its
            // peak); never past its fair share. Newcomers arriving together keep nothing
            // until they are steady, so they cannot hold room back from a steady tenant.
            let steady = now.saturating_duration_since(share.since) >= AVERAGE_OVER;
            let next = if steady { share.last_cost } else { 0 };
            let want = share.peak().max(share.kv.saturating_add(next));
            let keep = want.min(fair).saturating_sub(share.kv);
            if keep > 0 {
                reserve.keeps.push((tenant.clone(), keep));
                reserve.slot = reserve.slot.max(share.last_cost);
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
mod tests {
    use super::*;

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Pretend `tenant` has held `kv` on average for a while.
    fn set_average(shares: &TenantShares, tenant: &str, kv: f64) {
        let mut tenants = shares.lock();
        let share = tenants.get_mut(tenant).expect("known tenant");
        share.average = kv;
        share.average_at = Instant::now();
        make_steady(share);
    }

    /// Pretend the tenant has been active for a while.
    fn make_steady(share: &mut Share) {
        share.since = Instant::now()
            .checked_sub(AVERAGE_OVER)
            .unwrap_or(share.since);
    }

    #[test]
    fn fair_share_splits_the_pool_by_the_active_tenants_weights() {
        let shares = Arc::new(TenantShares::default());
        let _a = shares.hold(name("a"), 1, 600);
        let _b = shares.hold(name("b"), 2, 100);
        // 1200 tokens; a: 1/3 = 400, b: 2/3 = 800 (by their averages).
        set_average(&shares, "a", 600.0);
        set_average(&shares, "b", 799.0);
        assert!(!shares.under_share(&name("a"), 1, 1200, 0));
        assert!(shares.under_share(&name("b"), 2, 1200, 0));
        set_average(&shares, "b", 801.0);
        assert!(!shares.under_share(&name("b"), 2, 1200, 0));
        // A newcomer has no history: below.
        assert!(shares.under_share(&name("c"), 1, 1200, 0));
    }

    #[test]
    fn a_burst_above_the_share_still_counts_as_below_while_the_average_is() {
        let shares = Arc::new(TenantShares::default());
        let _flood = shares.hold(name("flood"), 1, 900);
        let _burst: Vec<ShareHold> = (0..6).map(|_| shares.hold(name("light"), 1, 100)).collect();
        // Holding 600 of a fair 500 right now, but 300 on average.
        set_average(&shares, "light", 300.0);
        assert!(shares.under_share(&name("light"), 1, 1000, 0));
    }

    #[test]
    fn a_light_tenant_keeps_its_recent_room_for_itself() {
        let shares = Arc::new(TenantShares::default());
        let _flood = shares.hold(name("flood"), 1, 5000);
        set_average(&shares, "flood", 5000.0);
        let mut light: Vec<ShareHold> =
            (0..3).map(|_| shares.hold(name("light"), 1, 100)).collect();
        set_average(&shares, "light", 300.0);
        // Capacity 10000, fair 5000 each; light holds its peak (300): one more request kept.
        assert_eq!(shares.reserve(10_000, 1.0).from_others_than("flood"), 100);
        // One answer ends: its room is kept too.
        light.pop();
        let reserve = shares.reserve(10_000, 1.0);
        assert_eq!(reserve.from_others_than("flood"), 100);
        assert_eq!(reserve.slot, 100);
        // Its own kept room is not kept from it.
        assert_eq!(reserve.from_others_than("light"), 0);
        drop(light);
        // Its answers ended: the room it used is kept (its peak), not given to the flood.
        assert_eq!(shares.reserve(10_000, 1.0).from_others_than("flood"), 300);
        // Capped by the configured fraction, in whole slots: below one slot, nothing.
        assert_eq!(shares.reserve(10_000, 0.025).from_others_than("flood"), 200);
        assert_eq!(shares.reserve(10_000, 0.01).from_others_than("flood"), 100);
        assert_eq!(shares.reserve(10_000, 0.0099).from_others_than("x"), 0);
        assert!(shares.reserve(10_000, 0.0).is_empty());
    }

    #[test]
    fn a_newcomer_keeps_no_room_until_it_is_steady() {
        let shares = Arc::new(TenantShares::default());
        let _a = shares.hold(name("a"), 1, 500);
        let _b = shares.hold(name("b"), 1, 100);
        // b is below its share (500 of 1000) and holds its peak: nothing kept for it yet.
        assert!(shares.reserve(1000, 1.0).is_empty());
        make_steady(shares.lock().get_mut("b").expect("b"));
        assert_eq!(shares.reserve(1000, 1.0).from_others_than("a"), 100);
    }

    #[test]
    fn nothing_is_kept_past_a_tenants_fair_share() {
        let shares = Arc::new(TenantShares::default());
        let _a = shares.hold(name("a"), 1, 900);
        let _burst: Vec<ShareHold> = (0..5).map(|_| shares.hold(name("b"), 1, 100)).collect();
        // b holds 500, its fair share of 1000, though its average says below.
        set_average(&shares, "b", 100.0);
        assert!(shares.under_share(&name("b"), 1, 1000, 0));
        assert_eq!(shares.reserve(1000, 1.0).from_others_than("a"), 0);
    }

    #[test]
    fn tenants_at_their_share_keep_nothing() {
        let shares = Arc::new(TenantShares::default());
        let _a = shares.hold(name("a"), 1, 500);
        let _b = shares.hold(name("b"), 1, 500);
        set_average(&shares, "a", 500.0);
        set_average(&shares, "b", 500.0);
        assert!(shares.reserve(1000, 1.0).is_empty());
    }

    #[test]
    fn what_a_tenant_has_waiting_counts_against_its_share() {
        let shares = Arc::new(TenantShares::default());
        let _flood = shares.hold(name("flood"), 1, 900);
        set_average(&shares, "flood", 900.0);
        assert!(shares.under_share(&name("light"), 1, 1000, 0));
        let mark = shares.waiting(name("light"), 1, 100);
        // A second request while one waits queues behind it (no going ahead).
        assert!(!shares.under_share(&name("light"), 1, 1000, 0));
        make_steady(shares.lock().get_mut("light").expect("light"));
        // Two active tenants: light's fair share is 500; room is kept for its waiting one.
        assert_eq!(shares.reserve(1000, 1.0).from_others_than("flood"), 100);
        let marks: Vec<WaitingMark> = (0..5)
            .map(|_| shares.waiting(name("light"), 1, 100))
            .collect();
        // 600 waiting, 500 beyond its next request: at its share, nothing kept.
        assert!(shares.reserve(1000, 1.0).is_empty());
        drop(marks);
        drop(mark);
        assert!(shares.under_share(&name("light"), 1, 1000, 0));
        assert_eq!(shares.len(), 2, "light stays known while recent");
    }

    #[test]
    fn the_average_follows_the_held_kv_over_seconds() {
        let mut share = Share::new(1, Instant::now());
        share.kv = 1000;
        let later = share.average_at + AVERAGE_OVER;
        share.settle(later);
        // One time constant: 1 - 1/e of the way.
        assert!((share.average - 632.1).abs() < 1.0, "{}", share.average);
    }

    #[test]
    fn each_tenants_keep_is_a_whole_slot_or_more() {
        let reserve = Reserve {
            keeps: vec![(name("light"), 456), (name("w2"), 461)],
            cap: 4096,
            slot: 461,
        };
        // Light's 456 is one slot of the largest request, not nothing.
        assert_eq!(reserve.from_others_than("w2"), 461);
        assert_eq!(reserve.from_others_than("eq1"), 922);
        let capped = Reserve {
            cap: 500,
            ..reserve
        };
        assert_eq!(capped.from_others_than("eq1"), 461);
    }

    #[test]
    fn kept_room_counts_whole_slots_only() {
        assert!(keeps_fit(&[150, 50], 100, 100));
        assert!(!keeps_fit(&[150, 99], 200, 100));
        assert!(keeps_fit(&[200, 0], 200, 100));
        assert!(keeps_fit(&[0], 0, 100));
    }
}
