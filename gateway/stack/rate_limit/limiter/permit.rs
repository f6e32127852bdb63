//! Admission against a [`LimitStore`] and the RAII permit that undoes it.
//!
//! [`Limiter::admit`] takes a concurrency slot, then reserves one request and the
//! request's worst-case tokens. The [`TenantPermit`] it returns is meant to be moved into
//! the response body (the guard-in-the-body pattern): when it drops — stream finished,
//! error, or client gone — it settles the tokens with the engine's usage (if
//! [`TenantPermit::settle_with`] was called) and gives the slot back.

use futures_util::future::BoxFuture;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use super::memory::CONCURRENCY_RETRY;
use super::{Decision, Denied, LimitStore, StoreError, TenantLimits};

/// Admits requests against a shared store; cheap to clone.
#[derive(Clone)]
pub struct Limiter {
    store: Arc<dyn LimitStore>,
}

/// The outcome of [`Limiter::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Everything was taken; hold the permit until the response ends.
    Admitted(TenantPermit),
    /// Nothing was taken; answer 429 (or 4xx for [`Denied::TokensOverBudget`]).
    Denied(Decision),
}

// === impl Limiter ===

impl Limiter {
    /// Periodic housekeeping of the store (see [`LimitStore::sweep`]).
    pub fn sweep(&self) {
        self.store.sweep();
    }

    /// A limiter over `store` (usually a [`super::GuardedStore`]).
    pub fn new(store: impl LimitStore) -> Self {
        Self {
            store: Arc::new(store),
        }
    }

    /// A limiter over an already shared store.
    pub fn from_arc(store: Arc<dyn LimitStore>) -> Self {
        Self { store }
    }

    /// The store behind this limiter.
    pub fn store(&self) -> &Arc<dyn LimitStore> {
        &self.store
    }

    /// Take a slot (if `max_concurrent` is set), then one request and `tokens` tokens.
    ///
    /// On any denial or error nothing stays taken: a slot already granted is given back.
    /// Errors only come from an unguarded store; a [`super::GuardedStore`] never fails.
    pub async fn admit(
        &self,
        tenant: impl Into<Arc<str>>,
        limits: &TenantLimits,
        tokens: u64,
    ) -> Result<Admission, StoreError> {
        let mut permit = TenantPermit {
            store: Arc::clone(&self.store),
            tenant: tenant.into(),
            limits: *limits,
            reserved: None,
            actual: None,
            slot: false,
            decision: Decision::allow_unlimited(limits),
        };
        if limits.max_concurrent.is_some() {
            if !self.store.acquire_slot(&permit.tenant, limits).await? {
                return Ok(Admission::Denied(Decision::deny(
                    limits,
                    Denied::Concurrency,
                    CONCURRENCY_RETRY,
                )));
            }
            // From here on, dropping `permit` (denial, error) releases the slot.
            permit.slot = true;
        }
        let decision = self.store.reserve(&permit.tenant, limits, tokens).await?;
        if !decision.allowed {
            return Ok(Admission::Denied(decision));
        }
        permit.decision = decision;
        permit.reserved = Some(tokens);
        Ok(Admission::Admitted(permit))
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("backend", &self.store.backend())
            .finish()
    }
}

/// An admitted request's hold on its tenant's budget. Dropping it releases the
/// concurrency slot and settles the tokens; with a store that answers asynchronously
/// (Redis) that happens on a spawned task, so dropping never blocks.
pub struct TenantPermit {
    store: Arc<dyn LimitStore>,
    tenant: Arc<str>,
    limits: TenantLimits,
    /// Tokens taken at admission; `None` until the reservation succeeded.
    reserved: Option<u64>,
    /// Tokens the engine reported; `None` keeps the reservation as charged.
    actual: Option<u64>,
    slot: bool,
    decision: Decision,
}

// === impl TenantPermit ===

impl TenantPermit {
    /// Record the engine's usage (prompt + completion tokens); the difference to the
    /// reservation is refunded or charged when the permit drops. Without a call the
    /// reservation stands, which is what a client disconnect mid-stream should cost.
    pub fn settle_with(&mut self, actual_tokens: u64) {
        self.actual = Some(actual_tokens);
    }

    /// The admission decision, for the `x-ratelimit-*` headers.
    pub fn decision(&self) -> &Decision {
        &self.decision
    }

    /// The tenant this permit belongs to.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Tokens reserved at admission.
    pub fn reserved_tokens(&self) -> u64 {
        self.reserved.unwrap_or(0)
    }
}

impl fmt::Debug for TenantPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantPermit")
            .field("tenant", &self.tenant)
            .field("reserved", &self.reserved)
            .field("actual", &self.actual)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Drop for TenantPermit {
    fn drop(&mut self) {
        let settle = match (self.reserved, self.actual) {
            (Some(reserved), Some(actual)) if reserved != actual => Some((reserved, actual)),
            _ => None,
        };
        if settle.is_none() && !self.slot {
            return;
        }
        let store = Arc::clone(&self.store);
        let tenant = Arc::clone(&self.tenant);
        let limits = self.limits;
        let slot = self.slot;
        let mut work: BoxFuture<'static, ()> = Box::pin(async move {
            if let Some((reserved, actual)) = settle {
                if let Err(error) = store.settle(&tenant, &limits, reserved, actual).await {
                    tracing::debug!(%error, "settling tokens failed");
                }
            }
            if slot {
                if let Err(error) = store.release_slot(&tenant).await {
                    tracing::debug!(%error, "releasing a concurrency slot failed");
                }
            }
        });
        // The memory store finishes on the first poll: no task, no allocation beyond the box.
        // Anything still pending moves, already started, onto a task that drives it. Without
        // a runtime, a store that needs one must not even be polled (its timers would panic).
        let runtime = tokio::runtime::Handle::try_current().ok();
        if runtime.is_none() && !self.store.completes_inline() {
            tracing::warn!(
                tenant = %self.tenant,
                "permit dropped outside a runtime; the backend's lease expiry reclaims it"
            );
            return;
        }
        let mut cx = Context::from_waker(Waker::noop());
        if let (Poll::Pending, Some(runtime)) = (work.as_mut().poll(&mut cx), runtime) {
            runtime.spawn(work);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::rate_limit::limiter::MemoryStore;
    use futures_util::FutureExt;

    #[test]
    fn memory_permit_releases_without_a_runtime() {
        let store = Arc::new(MemoryStore::new());
        let limiter = Limiter::from_arc(store.clone());
        let limits = TenantLimits {
            max_concurrent: Some(1),
            ..TenantLimits::UNLIMITED
        };
        let admission = limiter.admit("t", &limits, 0).now_or_never();
        let Some(Ok(Admission::Admitted(permit))) = admission else {
            panic!("admitted");
        };
        assert_eq!(store.slots_in_use("t"), 1);
        drop(permit);
        assert_eq!(store.slots_in_use("t"), 0);
    }
}
