//! The response guard (I1): an aborted, refused or placeholder result never reaches a client
//! as a success.
//!
//! Sits right above dispatch, so it sees every engine answer, the prefill leg of PD requests
//! included. Non-streaming answers are checked whole ([`inspect::check_answer`]); streams are
//! re-framed and checked event by event ([`check_stream::StreamCheck`]), with the status line
//! held until the first event has been checked. A trip becomes kvgate's JSON error (status
//! mapping in `GatewayError`), or — once a stream is under way — an SSE error event that ends
//! the stream without `[DONE]`. Every trip is one audit line and one
//! `kvgate_guard_trips_total{reason,pool}`; every stream's outcome is counted once (I6).
//! Trips, leak suspicions and stream outcomes are also counted in the status page's
//! recent [`Activity`].
//!
//! `handle` reads as its steps: the `plan` (every request extension, read once), the
//! answer from below, its `report`, the leak scan isolation handed over ([`LeakWatch`]),
//! the `prefill` answer's check, then the `whole` answer or the `stream`.
//!
//! Reads: `InferenceRequest`, `RoutePlan`, `TokenCount`, `UsageCell`, `AuthContext`,
//! `RequestId`, `LeakWatch` (see `plan`); the response extensions `PrefillAnswer`,
//! `BufferedAnswer` and `ServedBy` from dispatch. Writes: `OutcomeAtStreamEnd` on streams.

mod anthropic;
pub mod check_stream;
mod event_stream;
mod extensions;
pub mod inspect;
pub mod leak;
mod plan;
mod prefill;
mod report;
mod responses;
pub mod sse;
mod stream;
mod stream_end;
mod strip_key;
mod whole;

pub use extensions::{BufferedAnswer, OutcomeAtStreamEnd, PrefillAnswer};
pub use report::{trip_error, TripReport};

use http::Request;
use std::collections::HashMap;
use std::sync::Arc;

use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::stack::isolate::LeakWatch;
use crate::stack::routing::ServedBy;
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};
use leak::LeakScan;
use plan::{GuardPlan, PoolRules};
use prefill::check_prefill_answer;
use report::Sinks;
use stream::guard_stream;
use whole::check_whole_answer;

/// Shared state of the guard.
#[derive(Debug)]
pub struct GuardState {
    pools: HashMap<String, PoolRules>,
    sinks: Arc<Sinks>,
}

impl GuardState {
    /// Per-pool rules from the config; trips and outcomes are counted in `activity`.
    pub fn from_config(config: &Config, audit: AuditLog, activity: Arc<Activity>) -> Self {
        let pools = config
            .pools
            .iter()
            .map(|p| (p.name.clone(), PoolRules::from_config(&p.guard)))
            .collect();
        Self {
            pools,
            sinks: Arc::new(Sinks::new(audit, activity)),
        }
    }
}

/// The guard stage.
#[derive(Debug, Clone)]
pub struct Guard {
    state: Arc<GuardState>,
}

/// The guard stage as a layer.
pub type GuardLayer = StageLayer<Guard>;

impl Guard {
    /// Guard with `state`.
    pub fn layer(state: Arc<GuardState>) -> GuardLayer {
        StageLayer::new(Guard { state })
    }
}

/// The answer's leak scan, from what isolation handed over: ready once the tenant's own
/// prompt is on record; a suspicion is reported through `report`.
async fn leak_scan(watch: Option<LeakWatch>, report: &TripReport) -> Option<LeakScan> {
    let watch = watch?;
    let mode = watch.mode();
    let scanner = watch.scanner().await?;
    let report = report.clone();
    Some(LeakScan::new(
        scanner,
        mode,
        Arc::new(move |s| report.leak(s)),
    ))
}

// === impl Guard ===

impl Stage for Guard {
    fn handle(&self, mut request: Request<bytes::Bytes>, next: Next) -> StageFuture {
        let state = self.state.clone();
        Box::pin(async move {
            let Some((mut plan, facts)) = GuardPlan::read(&mut request, &state.pools)? else {
                // Neither checks nor a leak scan for this pool: nothing to read.
                return next.oneshot(request).await;
            };
            let mut response = next.oneshot(request).await?;
            let served = response.extensions().get::<ServedBy>();
            let report = TripReport::new(state.sinks.clone(), plan.pool.clone(), facts, served);
            let leak = leak_scan(plan.leak.take(), &report).await;
            let expect = plan.expectation().await;
            check_prefill_answer(&mut response, &plan, &expect, &report)?;
            let (mut parts, body) = response.into_parts();
            if plan.stream && (plan.responses.is_some() || plan.anthropic) {
                // Followed to their end like chat streams (`stream_end`): their outcome and
                // audit line are written there, not by rescue at the headers.
                parts.extensions.insert(OutcomeAtStreamEnd);
            }
            let answer = if let (Some(continuation), true) = (plan.responses, plan.stream) {
                // `/v1/responses` events are their own protocol (no chunks, no `[DONE]`).
                Ok(responses::guard_responses_stream(
                    parts,
                    body,
                    responses::StreamChecks {
                        expect,
                        continuation,
                        enabled: plan.checks,
                        leak,
                    },
                    report,
                    plan.usage.clone(),
                ))
            } else if plan.anthropic && plan.stream {
                // Anthropic events the engine wrote: checked in their own protocol.
                Ok(anthropic::guard_messages_stream(
                    parts,
                    body,
                    plan.checks.then_some(expect),
                    leak,
                    report,
                    plan.usage.clone(),
                ))
            } else if plan.stream {
                guard_stream(parts, body, &plan, expect, leak, report).await
            } else {
                check_whole_answer(parts, body, &plan, &expect, leak, &report).await
            };
            Ok(answer?)
        })
    }
}
