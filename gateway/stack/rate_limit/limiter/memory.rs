//! The in-process backend: one `DashMap` entry per tenant holding three atomics.
//!
//! The hot path is a shard read lock (`get`) plus a CAS loop per limited dimension; a new
//! tenant goes through `entry()`, so two first requests racing cannot each insert a state
//! and lose the other's take. Time is `tokio::time::Instant`, so tests drive it with
//! `tokio::time::pause()`/`advance`.

use dashmap::DashMap;
use futures_util::future::{self, FutureExt};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::gcra;
use super::{Decision, Denied, LimitStore, StoreFuture, TenantLimits};

/// Per-tenant budgets in this process only (a single gateway replica, tests, benches).
#[derive(Debug)]
pub struct MemoryStore {
    tenants: DashMap<Arc<str>, Arc<TenantState>>,
    /// TATs are nanoseconds since this instant, so they fit a `u64` for ~584 years.
    origin: Instant,
}

#[derive(Debug, Default)]
struct TenantState {
    requests: AtomicU64,
    tokens: AtomicU64,
    slots: AtomicU32,
}

// === impl MemoryStore ===

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store whose clock starts now.
    pub fn new() -> Self {
        Self {
            tenants: DashMap::new(),
            origin: Instant::now(),
        }
    }

    /// Tenants with state (for tests; the gateway's housekeeping sweeps idle ones).
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// Forget tenants whose buckets are full and who hold no slot: their state is the same
    /// as a fresh one, so dropping it changes no decision.
    pub fn evict_idle(&self) {
        let now = self.now_ns();
        self.tenants.retain(|_, s| {
            s.slots.load(Ordering::Acquire) > 0
                || s.requests.load(Ordering::Acquire) > now
                || s.tokens.load(Ordering::Acquire) > now
        });
    }

    fn now_ns(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    fn state(&self, tenant: &str) -> Arc<TenantState> {
        if let Some(state) = self.tenants.get(tenant) {
            return Arc::clone(state.value());
        }
        Arc::clone(self.tenants.entry(Arc::from(tenant)).or_default().value())
    }

    /// The synchronous core of [`LimitStore::reserve`].
    pub fn reserve_now(&self, tenant: &str, limits: &TenantLimits, tokens: u64) -> Decision {
        let mut decision = Decision::allow_unlimited(limits);
        if limits.requests_per_minute.is_none() && limits.tokens_per_minute.is_none() {
            return decision;
        }
        if limits.requests_per_minute == Some(0) {
            return Decision::deny(limits, Denied::Requests, super::WINDOW);
        }
        if let Some(tpm) = limits.tokens_per_minute {
            if tokens > tpm {
                return Decision::deny(limits, Denied::TokensOverBudget, super::WINDOW);
            }
        }
        let state = self.state(tenant);
        let now = self.now_ns();

        let mut taken_requests = None;
        if let Some(rpm) = limits.requests_per_minute {
            let take = gcra::take(&state.requests, now, 1, u64::from(rpm));
            decision.remaining_requests = Some(u32::try_from(take.remaining).unwrap_or(rpm));
            decision.reset_requests = take.reset;
            if !take.allowed {
                decision.allowed = false;
                decision.retry_after = take.retry_after;
                decision.denied_by = Some(Denied::Requests);
                if let Some(tpm) = limits.tokens_per_minute {
                    let (remaining, reset) = gcra::peek(&state.tokens, now, tpm);
                    decision.remaining_tokens = Some(remaining);
                    decision.reset_tokens = reset;
                }
                return decision;
            }
            taken_requests = Some((take, rpm));
        }
        if let Some(tpm) = limits.tokens_per_minute {
            let take = gcra::take(&state.tokens, now, tokens, tpm);
            decision.remaining_tokens = Some(take.remaining);
            decision.reset_tokens = take.reset;
            if !take.allowed {
                // Nothing is taken on denial: give the request back. Between the two CASes
                // another request may have seen one request fewer; that errs toward denial.
                if let Some((req, rpm)) = taken_requests {
                    gcra::give_back(&state.requests, req.cost_ns);
                    let (remaining, reset) = gcra::peek(&state.requests, now, u64::from(rpm));
                    decision.remaining_requests = Some(u32::try_from(remaining).unwrap_or(rpm));
                    decision.reset_requests = reset;
                }
                decision.allowed = false;
                decision.retry_after = take.retry_after;
                decision.denied_by = Some(Denied::Tokens);
            }
        }
        decision
    }

    /// The synchronous core of [`LimitStore::settle`].
    pub fn settle_now(&self, tenant: &str, limits: &TenantLimits, reserved: u64, actual: u64) {
        let Some(tpm) = limits.tokens_per_minute.filter(|&t| t > 0) else {
            return;
        };
        if reserved == actual {
            return;
        }
        let state = self.state(tenant);
        if actual < reserved {
            gcra::give_back(&state.tokens, gcra::cost_ns(reserved - actual, tpm));
        } else {
            gcra::charge(
                &state.tokens,
                self.now_ns(),
                gcra::cost_ns(actual - reserved, tpm),
            );
        }
    }

    /// The synchronous core of [`LimitStore::acquire_slot`].
    pub fn acquire_slot_now(&self, tenant: &str, limits: &TenantLimits) -> bool {
        let Some(max) = limits.max_concurrent else {
            return true;
        };
        self.state(tenant)
            .slots
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// The synchronous core of [`LimitStore::release_slot`].
    pub fn release_slot_now(&self, tenant: &str) {
        if let Some(state) = self.tenants.get(tenant) {
            // Saturating: releasing for a tenant that had no limit when it was admitted
            // (limits changed mid-flight) must not underflow.
            let _ = state
                .slots
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        }
    }

    /// Slots currently held by `tenant`.
    pub fn slots_in_use(&self, tenant: &str) -> u32 {
        self.tenants
            .get(tenant)
            .map_or(0, |s| s.slots.load(Ordering::Acquire))
    }
}

/// The retry hint when all slots are taken: slots free when responses end, which no clock
/// predicts, so this is a polite back-off rather than a promise.
pub(crate) const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

impl LimitStore for MemoryStore {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        tokens: u64,
    ) -> StoreFuture<'a, Decision> {
        future::ready(Ok(self.reserve_now(tenant, limits, tokens))).boxed()
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        reserved: u64,
        actual: u64,
    ) -> StoreFuture<'a, ()> {
        self.settle_now(tenant, limits, reserved, actual);
        future::ready(Ok(())).boxed()
    }

    fn acquire_slot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
    ) -> StoreFuture<'a, bool> {
        future::ready(Ok(self.acquire_slot_now(tenant, limits))).boxed()
    }

    fn release_slot<'a>(&'a self, tenant: &'a str) -> StoreFuture<'a, ()> {
        self.release_slot_now(tenant);
        future::ready(Ok(())).boxed()
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    fn completes_inline(&self) -> bool {
        true
    }

    fn sweep(&self) {
        self.evict_idle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    #[test]
    fn sweep_forgets_only_tenants_whose_state_changes_nothing() {
        let store = MemoryStore::new();
        let limits = TenantLimits {
            max_concurrent: Some(1),
            ..TenantLimits::UNLIMITED
        };
        assert!(store
            .acquire_slot("a", &limits)
            .now_or_never()
            .unwrap()
            .unwrap());
        assert_eq!(store.tenant_count(), 1);
        store.sweep();
        // A held slot is state that decides the next request: kept.
        assert_eq!(store.tenant_count(), 1);
        store.release_slot("a").now_or_never().unwrap().unwrap();
        store.sweep();
        assert_eq!(store.tenant_count(), 0);
    }
}
