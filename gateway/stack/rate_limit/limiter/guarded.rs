//! The failure policy around a limit store.
//!
//! A limit store is a dependency the gateway can outlive (Redis restarts, a network
//! partition). [`GuardedStore`] never returns an error: it answers by the policy instead,
//! counts every failure, and logs only on health *transitions* (healthy → failing → healthy),
//! so a dead Redis under load produces two log lines, not one per request.

use futures_util::future::FutureExt;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::{Decision, Denied, LimitStore, StoreError, StoreFuture, TenantLimits};
use crate::metrics::{STORE_ERRORS_TOTAL, STORE_HEALTHY};

/// How long a fail-closed refusal tells the client to wait: long enough not to hammer a
/// failing store, short enough to notice its recovery.
const FAIL_CLOSED_RETRY: Duration = Duration::from_secs(1);

/// What to do when the limit store cannot answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admit (limits are not enforced while the store is down): availability first.
    #[default]
    FailOpen,
    /// Refuse with 429 [`Denied::StoreUnavailable`]: protection first.
    FailClosed,
}

/// A store wrapped with a [`FailurePolicy`]; its methods never return `Err`.
pub struct GuardedStore<S> {
    inner: S,
    policy: FailurePolicy,
    healthy: AtomicBool,
    errors: AtomicU64,
    transitions: AtomicU64,
}

// === impl GuardedStore ===

impl<S: LimitStore> GuardedStore<S> {
    /// Wrap `inner`; it starts out healthy.
    pub fn new(inner: S, policy: FailurePolicy) -> Self {
        Self::starting(inner, policy, true)
    }

    /// Wrap `inner`, healthy or not to begin with (a Redis that did not answer at
    /// start-up starts unhealthy: the gauge says so until an operation succeeds).
    pub fn starting(inner: S, policy: FailurePolicy, healthy: bool) -> Self {
        metrics::gauge!(STORE_HEALTHY, "backend" => inner.backend()).set(if healthy {
            1.0
        } else {
            0.0
        });
        Self {
            inner,
            policy,
            healthy: AtomicBool::new(healthy),
            errors: AtomicU64::new(0),
            transitions: AtomicU64::new(0),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The configured policy.
    pub fn policy(&self) -> FailurePolicy {
        self.policy
    }

    /// Whether the last operation succeeded.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Failures seen since construction.
    pub fn error_count(&self) -> u64 {
        self.errors.load(Ordering::Acquire)
    }

    /// Health transitions (each one logged once) since construction.
    pub fn transitions(&self) -> u64 {
        self.transitions.load(Ordering::Acquire)
    }

    fn ok(&self) {
        // One relaxed load on the healthy path; the swap only runs after a failure.
        if !self.healthy.load(Ordering::Relaxed) && !self.healthy.swap(true, Ordering::AcqRel) {
            self.transitions.fetch_add(1, Ordering::AcqRel);
            let backend = self.inner.backend();
            metrics::gauge!(STORE_HEALTHY, "backend" => backend).set(1.0);
            tracing::info!(backend, "limit store recovered; enforcing limits again");
        }
    }

    fn failed(&self, op: &'static str, error: &StoreError) {
        let backend = self.inner.backend();
        self.errors.fetch_add(1, Ordering::AcqRel);
        metrics::counter!(STORE_ERRORS_TOTAL, "backend" => backend).increment(1);
        if self.healthy.swap(false, Ordering::AcqRel) {
            self.transitions.fetch_add(1, Ordering::AcqRel);
            metrics::gauge!(STORE_HEALTHY, "backend" => backend).set(0.0);
            tracing::warn!(
                backend,
                op,
                %error,
                policy = ?self.policy,
                misconfigured = error.is_misconfiguration(),
                "limit store failing; applying the failure policy until it answers again (fail closed while Redis is misconfigured)"
            );
        } else {
            tracing::debug!(backend, op, %error, "limit store still failing");
        }
    }

    /// `evidence`: whether this operation had to reach the backend. Decisions a store makes
    /// locally (an unlimited dimension, releasing a slot it never got from the backend) say
    /// nothing about the backend's health and must not end a failing period.
    ///
    /// `Err` is the policy to answer by: the configured one for an outage, fail-closed for
    /// a misconfiguration (MOVED from a node configured as one, WRONGTYPE, …), which no
    /// amount of waiting fixes and which must not serve every tenant unlimited for good.
    fn check<T>(
        &self,
        op: &'static str,
        evidence: bool,
        result: Result<T, StoreError>,
    ) -> Result<T, FailurePolicy> {
        match result {
            Ok(value) => {
                if evidence {
                    self.ok();
                }
                Ok(value)
            }
            Err(error) => {
                self.failed(op, &error);
                Err(if error.is_misconfiguration() {
                    FailurePolicy::FailClosed
                } else {
                    self.policy
                })
            }
        }
    }
}

impl<S> fmt::Debug for GuardedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedStore")
            .field("policy", &self.policy)
            .field("healthy", &self.healthy)
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl<S: LimitStore> LimitStore for GuardedStore<S> {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        tokens: u64,
    ) -> StoreFuture<'a, Decision> {
        async move {
            let result = self.inner.reserve(tenant, limits, tokens).await;
            let evidence =
                limits.requests_per_minute.is_some() || limits.tokens_per_minute.is_some();
            Ok(match self.check("reserve", evidence, result) {
                Ok(decision) => decision,
                Err(policy) => match policy {
                    FailurePolicy::FailOpen => Decision::allow_unlimited(limits),
                    FailurePolicy::FailClosed => {
                        Decision::deny(limits, Denied::StoreUnavailable, FAIL_CLOSED_RETRY)
                    }
                },
            })
        }
        .boxed()
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        reserved: u64,
        actual: u64,
    ) -> StoreFuture<'a, ()> {
        async move {
            // A lost settlement leaves the reservation charged as made: counted, not fatal.
            let result = self.inner.settle(tenant, limits, reserved, actual).await;
            let evidence = limits.tokens_per_minute.is_some() && reserved != actual;
            let _ = self.check("settle", evidence, result);
            Ok(())
        }
        .boxed()
    }

    fn acquire_slot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
    ) -> StoreFuture<'a, bool> {
        async move {
            let result = self.inner.acquire_slot(tenant, limits).await;
            let evidence = limits.max_concurrent.is_some();
            // Fail-closed refuses the slot, so the client sees a concurrency 429 rather than
            // StoreUnavailable; either way nothing was taken.
            Ok(self
                .check("acquire_slot", evidence, result)
                .unwrap_or_else(|policy| policy == FailurePolicy::FailOpen))
        }
        .boxed()
    }

    fn release_slot<'a>(&'a self, tenant: &'a str) -> StoreFuture<'a, ()> {
        async move {
            // A lost release is reclaimed by the backend's lease expiry.
            let result = self.inner.release_slot(tenant).await;
            // Never evidence: a slot granted by the fail-open policy is released locally.
            let _ = self.check("release_slot", false, result);
            Ok(())
        }
        .boxed()
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn completes_inline(&self) -> bool {
        self.inner.completes_inline()
    }

    fn sweep(&self) {
        self.inner.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::future;
    use std::sync::atomic::AtomicBool;

    /// A backend that fails while `down` is set.
    #[derive(Default)]
    struct Flaky {
        down: AtomicBool,
        /// Answers as a Redis that is misconfigured (MOVED from a cluster node).
        misconfigured: AtomicBool,
    }

    impl Flaky {
        fn answer<T: Send + 'static>(&self, value: T) -> StoreFuture<'_, T> {
            let result = if self.misconfigured.load(Ordering::Acquire) {
                Err(StoreError::Misconfigured {
                    reason: "moved",
                    fix: "configure redis cluster mode",
                    detail: "MOVED 1234 10.0.0.12:6379".into(),
                })
            } else if self.down.load(Ordering::Acquire) {
                Err(StoreError::Timeout(Duration::from_millis(1)))
            } else {
                Ok(value)
            };
            future::ready(result).boxed()
        }
    }

    impl LimitStore for Flaky {
        fn reserve<'a>(
            &'a self,
            _: &'a str,
            limits: &'a TenantLimits,
            _: u64,
        ) -> StoreFuture<'a, Decision> {
            self.answer(Decision::allow_unlimited(limits))
        }
        fn settle<'a>(
            &'a self,
            _: &'a str,
            _: &'a TenantLimits,
            _: u64,
            _: u64,
        ) -> StoreFuture<'a, ()> {
            self.answer(())
        }
        fn acquire_slot<'a>(&'a self, _: &'a str, _: &'a TenantLimits) -> StoreFuture<'a, bool> {
            self.answer(true)
        }
        fn release_slot<'a>(&'a self, _: &'a str) -> StoreFuture<'a, ()> {
            self.answer(())
        }
        fn backend(&self) -> &'static str {
            "flaky"
        }
    }

    const LIMITS: TenantLimits = TenantLimits {
        requests_per_minute: Some(10),
        tokens_per_minute: None,
        max_concurrent: None,
    };

    fn reserve(store: &GuardedStore<Flaky>) -> Decision {
        store
            .reserve("t", &LIMITS, 1)
            .now_or_never()
            .and_then(Result::ok)
            .expect("a guarded store answers at once and never fails")
    }

    #[test]
    fn a_misconfiguration_fails_closed_even_under_fail_open() {
        let open = GuardedStore::new(Flaky::default(), FailurePolicy::FailOpen);
        open.inner().misconfigured.store(true, Ordering::Release);
        let d = reserve(&open);
        assert!(!d.allowed);
        assert_eq!(d.denied_by, Some(Denied::StoreUnavailable));
        let slot = open.acquire_slot("t", &LIMITS).now_or_never();
        assert!(matches!(slot, Some(Ok(false))));
        // An outage still follows the policy.
        open.inner().misconfigured.store(false, Ordering::Release);
        open.inner().down.store(true, Ordering::Release);
        assert!(reserve(&open).allowed);
    }

    #[test]
    fn policy_counts_and_transitions_are_exported() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let open = GuardedStore::new(Flaky::default(), FailurePolicy::FailOpen);
            assert!(reserve(&open).allowed);
            open.inner().down.store(true, Ordering::Release);
            for _ in 0..3 {
                let d = reserve(&open);
                assert!(d.allowed);
                assert_eq!(d.remaining_requests, None);
            }
            assert!(!open.is_healthy());
            assert_eq!((open.error_count(), open.transitions()), (3, 1));
            let rendered = handle.render();
            assert!(rendered.contains("kvgate_limit_store_errors_total{backend=\"flaky\"} 3"));
            assert!(rendered.contains("kvgate_limit_store_healthy{backend=\"flaky\"} 0"));

            // A local-only success (release) is no evidence; a real answer is.
            open.inner().down.store(false, Ordering::Release);
            let _ = open.release_slot("t").now_or_never();
            assert!(!open.is_healthy());
            reserve(&open);
            assert!(open.is_healthy());
            assert_eq!(open.transitions(), 2);
            assert!(handle
                .render()
                .contains("kvgate_limit_store_healthy{backend=\"flaky\"} 1"));

            let closed = GuardedStore::new(Flaky::default(), FailurePolicy::FailClosed);
            closed.inner().down.store(true, Ordering::Release);
            let d = reserve(&closed);
            assert_eq!(d.denied_by, Some(Denied::StoreUnavailable));
            assert_eq!(d.retry_after, FAIL_CLOSED_RETRY);
        });
    }

    #[test]
    fn a_store_that_did_not_answer_at_start_up_is_unhealthy_until_it_does() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let store = GuardedStore::starting(Flaky::default(), FailurePolicy::FailOpen, false);
            assert!(!store.is_healthy());
            assert!(handle
                .render()
                .contains("kvgate_limit_store_healthy{backend=\"flaky\"} 0"));
            reserve(&store);
            assert!(store.is_healthy());
            assert!(handle
                .render()
                .contains("kvgate_limit_store_healthy{backend=\"flaky\"} 1"));
        });
    }
}
