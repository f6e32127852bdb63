//! Per-tenant limits: requests per minute, tokens per minute and concurrent requests.
//!
//! A tenant's budget is a bucket per dimension that holds one minute's worth (a tenant may
//! spend its whole minute at once) and refills continuously. Admission *reserves* one
//! request and the request's worst-case tokens (prompt + max new tokens); when the response
//! ends, the permit *settles* with the engine's reported usage, refunding or charging the
//! difference. Concurrency is a slot held for as long as the response body lives.
//!
//! Backends behind one [`LimitStore`] trait:
//! - [`MemoryStore`]: one process; a `DashMap` of per-tenant atomics updated by CAS loops
//!   (GCRA on a "theoretical arrival time" in nanoseconds), so the hot path takes no lock
//!   beyond the map shard's read lock.
//! - [`RedisStore`]: shared by every gateway replica; each operation is one Lua script run
//!   atomically on the server with the server's clock, so replicas with skewed clocks agree.
//!
//! [`GuardedStore`] applies the failure policy (fail open or closed) when a backend errors,
//! logs health transitions once and exports `kvgate_limit_store_*` metrics. [`Limiter`]
//! turns a store into admission decisions and RAII [`TenantPermit`]s, which the request
//! path moves into the response body so the slot and the settlement happen when the stream
//! ends or the client disconnects, never when the headers leave.
//!
//! The stage sits after authentication (it needs the tenant) and after admission's token
//! count (it needs the prompt size); it reads nothing from request extensions itself.

mod gcra;
mod guarded;
mod memory;
mod permit;
mod redis;

use futures_util::future::BoxFuture;

/// What every [`LimitStore`] method returns.
pub type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;
use std::time::Duration;

pub use guarded::{FailurePolicy, GuardedStore};
pub use memory::MemoryStore;
pub use permit::{Admission, Limiter, TenantPermit};
pub use redis::{RedisOptions, RedisStore};

/// The window every per-minute limit refers to.
pub const WINDOW: Duration = Duration::from_secs(60);

/// A tenant's limits (shared with the tenant's policy).
pub use crate::tenant::TenantLimits;

/// Which limit refused a request (the client-facing classification lives with the error
/// type, so the error module needs no stage).
pub use crate::error::RateLimitKind as Denied;

/// The answer to a reservation, with what the OpenAI-style `x-ratelimit-*` headers need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed (everything was taken) or not (nothing was taken).
    pub allowed: bool,
    /// When denied, how long until the same request would be admitted (`Retry-After`).
    pub retry_after: Duration,
    /// `x-ratelimit-limit-requests`; `None` when unlimited.
    pub limit_requests: Option<u32>,
    /// `x-ratelimit-remaining-requests` after this decision.
    pub remaining_requests: Option<u32>,
    /// `x-ratelimit-reset-requests`: time until the request bucket is full again.
    pub reset_requests: Duration,
    /// `x-ratelimit-limit-tokens`; `None` when unlimited.
    pub limit_tokens: Option<u64>,
    /// `x-ratelimit-remaining-tokens` after this decision.
    pub remaining_tokens: Option<u64>,
    /// `x-ratelimit-reset-tokens`: time until the token bucket is full again.
    pub reset_tokens: Duration,
    /// Which limit refused the request; `None` when allowed.
    pub denied_by: Option<Denied>,
}

impl Decision {
    /// An admission with no limit information (unlimited tenant, or a failed store under
    /// fail-open).
    pub fn allow_unlimited(limits: &TenantLimits) -> Self {
        Self {
            allowed: true,
            retry_after: Duration::ZERO,
            limit_requests: limits.requests_per_minute,
            remaining_requests: None,
            reset_requests: Duration::ZERO,
            limit_tokens: limits.tokens_per_minute,
            remaining_tokens: None,
            reset_tokens: Duration::ZERO,
            denied_by: None,
        }
    }

    /// A refusal by `denied_by` with no bucket information.
    pub fn deny(limits: &TenantLimits, denied_by: Denied, retry_after: Duration) -> Self {
        Self {
            allowed: false,
            retry_after,
            denied_by: Some(denied_by),
            ..Self::allow_unlimited(limits)
        }
    }
}

/// A limit store failed; [`GuardedStore`] turns this into the configured policy.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The Redis client reported an error (connection refused, reset, script error…).
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    /// The store did not answer within its operation timeout.
    #[error("limit store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store has had no connection yet (Redis was down at start-up; connecting in the
    /// background).
    #[error("not connected to Redis yet (still connecting in the background)")]
    NotConnected,
    /// The store answered something this code does not understand.
    #[error("limit store protocol: {0}")]
    Protocol(String),
    /// Redis answered in a way that waiting will not fix (MOVED from a node configured as
    /// one, READONLY, WRONGTYPE, CROSSSLOT, refused auth): the configuration must change.
    /// The guard answers it fail-closed whatever the policy, so a wrong setup never serves
    /// every tenant unlimited for good.
    #[error("Redis is misconfigured for kvgate ({reason}): {detail}; fix: {fix}")]
    Misconfigured {
        /// The `kvgate_redis_problems_total` reason.
        reason: &'static str,
        /// What to change.
        fix: &'static str,
        /// Redis's reply.
        detail: String,
    },
}

impl StoreError {
    /// Whether this is a misconfiguration rather than an outage.
    pub fn is_misconfiguration(&self) -> bool {
        matches!(self, StoreError::Misconfigured { .. })
    }
}

/// Where tenant budgets live. Implementations are shared by every request (`Arc`), and each
/// method is atomic with respect to the others for the same tenant.
///
/// Futures are boxed (no `async-trait` crate) so the trait stays object safe: permits hold
/// an `Arc<dyn LimitStore>`.
pub trait LimitStore: Send + Sync + 'static {
    /// Atomically check and take one request and `tokens` tokens (prompt + max new tokens)
    /// for `tenant`. Nothing is taken when denied.
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        tokens: u64,
    ) -> StoreFuture<'a, Decision>;

    /// When the response ends: `actual` tokens used (engine usage) vs `reserved` — refund
    /// or charge the difference.
    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        reserved: u64,
        actual: u64,
    ) -> StoreFuture<'a, ()>;

    /// Concurrency: take a slot (`false` when at max).
    fn acquire_slot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
    ) -> StoreFuture<'a, bool>;

    /// Concurrency: give back a slot taken by [`LimitStore::acquire_slot`].
    fn release_slot<'a>(&'a self, tenant: &'a str) -> StoreFuture<'a, ()>;

    /// The backend's name for metric labels and logs (`memory`, `redis`).
    fn backend(&self) -> &'static str;

    /// Whether every future this store returns is ready on its first poll and needs no
    /// runtime (true for [`MemoryStore`]): a permit dropped outside a Tokio runtime can
    /// then still release its slot.
    fn completes_inline(&self) -> bool {
        false
    }

    /// Housekeeping, called periodically off the request path: drop state that no
    /// longer changes any decision (the in-memory store's idle tenants). Redis expires
    /// its keys itself.
    fn sweep(&self) {}
}
