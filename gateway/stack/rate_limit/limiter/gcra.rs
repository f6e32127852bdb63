//! GCRA on one `AtomicU64`: the bucket's "theoretical arrival time" (TAT) in nanoseconds
//! since the store's origin.
//!
//! With a window `W` and a limit `L`, one unit costs `W / L` ns. The bucket is full when
//! `TAT <= now`; taking `n` units moves `TAT` to `max(TAT, now) + n·W/L`, which is allowed
//! while `TAT - now <= W` (the burst is the whole window). This is a token bucket of
//! capacity `L` refilled continuously, held in a single word so that every update is one
//! compare-and-swap and a limit change needs no migration (the TAT is a time, not a count).
//!
//! Precision: a cost is rounded down to whole nanoseconds once per operation, so a burst of
//! `k` operations can over-admit by at most `k · L / W` units. For limits up to ~245,000
//! per minute (`L² < W` in ns) that is below one unit: exact.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The window in nanoseconds.
pub(crate) const WINDOW_NS: u64 = 60_000_000_000;
/// Debt from charges is capped at one extra window, so one huge engine report cannot lock
/// a tenant out for longer than two minutes.
const MAX_DEBT_NS: u64 = 2 * WINDOW_NS;

/// What one take did (or would have done).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Take {
    pub(crate) allowed: bool,
    /// Units left after this take (or now, when denied).
    pub(crate) remaining: u64,
    /// Until the bucket is full again.
    pub(crate) reset: Duration,
    /// When denied, until the same take would pass.
    pub(crate) retry_after: Duration,
    /// What the take added to the TAT (for a rollback).
    pub(crate) cost_ns: u64,
}

/// `n` units at `limit` per window, in nanoseconds (rounded down). `limit` is non-zero.
pub(crate) fn cost_ns(n: u64, limit: u64) -> u64 {
    let ns = u128::from(n) * u128::from(WINDOW_NS) / u128::from(limit.max(1));
    // Anything beyond the debt cap can never be admitted anyway; saturating keeps the
    // additions below from overflowing.
    u64::try_from(ns).unwrap_or(u64::MAX).min(MAX_DEBT_NS * 2)
}

/// Units left when the bucket is `debt_ns` from full.
fn remaining(debt_ns: u64, limit: u64) -> u64 {
    let free = WINDOW_NS.saturating_sub(debt_ns);
    let units = u128::from(free) * u128::from(limit) / u128::from(WINDOW_NS);
    u64::try_from(units).unwrap_or(u64::MAX)
}

/// Take `n` units at `limit` per window if they fit; nothing changes when they do not.
pub(crate) fn take(tat: &AtomicU64, now: u64, n: u64, limit: u64) -> Take {
    let cost = cost_ns(n, limit);
    let mut current = tat.load(Ordering::Acquire);
    loop {
        let base = current.max(now);
        let next = base + cost;
        let debt = next - now;
        if debt > WINDOW_NS {
            return Take {
                allowed: false,
                remaining: remaining(base - now, limit),
                reset: Duration::from_nanos(base - now),
                retry_after: Duration::from_nanos(debt - WINDOW_NS),
                cost_ns: 0,
            };
        }
        match tat.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                return Take {
                    allowed: true,
                    remaining: remaining(debt, limit),
                    reset: Duration::from_nanos(debt),
                    retry_after: Duration::ZERO,
                    cost_ns: cost,
                }
            }
            Err(actual) => current = actual,
        }
    }
}

/// The bucket's state without taking anything.
pub(crate) fn peek(tat: &AtomicU64, now: u64, limit: u64) -> (u64, Duration) {
    let debt = tat.load(Ordering::Acquire).saturating_sub(now);
    (remaining(debt, limit), Duration::from_nanos(debt))
}

/// Give back `cost_ns` (a rollback, or a refund). Subtraction commutes with concurrent
/// takes, so their effect is kept; a TAT below `now` simply means "full".
pub(crate) fn give_back(tat: &AtomicU64, cost_ns: u64) {
    let _ = tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
        Some(t.saturating_sub(cost_ns))
    });
}

/// Charge `cost_ns` unconditionally (usage beyond the reservation), capped at the debt limit.
pub(crate) fn charge(tat: &AtomicU64, now: u64, cost_ns: u64) {
    let _ = tat.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
        Some((t.max(now) + cost_ns).min(now + MAX_DEBT_NS))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    #[test]
    fn whole_minute_at_once_then_continuous_refill() {
        let tat = AtomicU64::new(0);
        for i in 0..60 {
            let t = take(&tat, 0, 1, 60);
            assert!(t.allowed, "take {i}");
            assert_eq!(t.remaining, 59 - i);
        }
        let denied = take(&tat, 0, 1, 60);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after, Duration::from_secs(1));
        assert_eq!(denied.reset, Duration::from_secs(60));
        assert!(!take(&tat, SEC - 1, 1, 60).allowed);
        assert!(take(&tat, SEC, 1, 60).allowed);
    }

    #[test]
    fn exact_for_limits_that_do_not_divide_the_window() {
        for limit in [7, 13, 999, 99_991, 244_000] {
            let tat = AtomicU64::new(0);
            let admitted = (0..limit + 10).filter(|_| take(&tat, 5, 1, limit).allowed);
            assert_eq!(admitted.count() as u64, limit, "limit {limit}");
        }
    }

    #[test]
    fn denied_take_changes_nothing_and_rollback_restores() {
        let tat = AtomicU64::new(0);
        let first = take(&tat, 0, 600, 1000);
        assert!(first.allowed);
        assert_eq!(first.remaining, 400);
        let big = take(&tat, 0, 401, 1000);
        assert!(!big.allowed);
        assert_eq!(big.remaining, 400);
        give_back(&tat, first.cost_ns);
        assert_eq!(peek(&tat, 0, 1000).0, 1000);
    }

    #[test]
    fn charge_is_capped() {
        let tat = AtomicU64::new(0);
        charge(&tat, 0, u64::MAX / 4);
        assert_eq!(tat.load(Ordering::Acquire), MAX_DEBT_NS);
        let t = take(&tat, 0, 0, 10);
        assert!(!t.allowed);
        assert_eq!(t.retry_after, Duration::from_secs(60));
    }
}
