//! [`Shared`]: the half of the stack's input that lives as long as the process. A reload
//! never replaces it: limits and their store, the audit log, the engine client, the body,
//! header and buffer ceilings, the in-flight ceiling, trace export, and what isolation must
//! never forget (the salt secret, the leak detector's memory of recent prompts).
//!
//! The other half is the [`crate::generation::Generation`], which a reload replaces whole;
//! [`crate::build_stack`] takes one of each.

use std::sync::Arc;
use tokio::sync::Semaphore;

use crate::accounting::Accounting;
use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::load::InFlightLimit;
use crate::stack::api::read_body::BodyLimits;
use crate::stack::dispatch::DispatchLimits;
use crate::stack::header_limits::HeaderLimits;
use crate::stack::isolate::IsolationMemory;
use crate::stack::rate_limit::limiter::Limiter;
use crate::stack::responses::ResponseOwners;
use crate::telemetry::Telemetry;
use crate::upstream::Upstream;

/// Process-wide state every stack (every data thread, every generation) shares.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Tenant RPM/TPM/concurrency, in memory or in Redis.
    pub limiter: Limiter,
    pub audit: AuditLog,
    /// Recent outcomes, trips and leak suspicions for the status page.
    pub activity: Arc<Activity>,
    /// Per-tenant accounting: the tenant series of the config in force (a reload installs
    /// the next book; the counts carry over).
    pub accounting: Arc<Accounting>,
    /// The engine client; each data thread has its own (pooled connections stay on their
    /// thread), the rest of `Shared` is the same for all.
    pub upstream: Upstream,
    /// Body size, deadlines and the buffer budget.
    pub body: BodyLimits,
    /// Response ceilings, the buffer budget and the retry budget of dispatch.
    pub dispatch: DispatchLimits,
    /// Largest header value and header block.
    pub headers: HeaderLimits,
    /// The global in-flight ceiling.
    pub in_flight: InFlightLimit,
    /// Trace context and span export (`[tracing]`).
    pub telemetry: Telemetry,
    /// The salt secret and the leak detector's memory: a reload must not forget them (a
    /// leak right after it would go unseen).
    pub isolation: IsolationMemory,
    /// This replica's name in rollout decisions and audit lines.
    pub replica: Arc<str>,
    /// Bounds concurrent exact counts on the blocking pool.
    pub count_permits: Arc<Semaphore>,
    /// Who owns each stored `/v1/responses` response (in the limits' Redis when there is
    /// one): a reload must not forget them.
    pub responses: Arc<ResponseOwners>,
}
