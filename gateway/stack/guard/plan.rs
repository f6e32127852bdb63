//! What the guard knows of a request before it goes down the stack: every request
//! extension it needs, read once here ([`GuardPlan::read`]), then handed to the prefill
//! check and to the whole-answer and stream paths.
//!
//! Reads: `RoutePlan`, `InferenceRequest` (and asks OpenAI-format engines for stream usage
//! in it), `TokenCount`, `UsageCell`, `Ledger`, `LeakWatch` (from isolation), `AuthContext`,
//! `RequestId`, `RequestTrace`, the request's signals; the `x-client-request-id` header.

use bytes::Bytes;
use http::Request;
use std::collections::HashMap;
use std::sync::Arc;

use super::check_stream::UsageRewrite;
use super::inspect::{Expectation, Markers, PoolingShape, Shape};
use crate::accounting::Ledger;
use crate::config::GuardConfig;
use crate::error::GatewayError;
use crate::stack::admission::TokenCount;
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::isolate::LeakWatch;
use crate::stack::observe::RequestSignals;
use crate::stack::rate_limit::UsageCell;
use crate::stack::request_id::{RequestId, CLIENT_REQUEST_ID};
use crate::stack::responses::Continuation;
use crate::stack::routing::RoutePlan;
use crate::telemetry::RequestTrace;

/// The guard rules of one pool.
#[derive(Debug)]
pub(super) struct PoolRules {
    pub(super) config: GuardConfig,
    pub(super) markers: Markers,
}

impl PoolRules {
    pub(super) fn from_config(config: &GuardConfig) -> Self {
        Self {
            markers: Markers::from_config(config),
            config: config.clone(),
        }
    }
}

/// The request's facts every guard audit line carries, kept as read: most answers write no
/// guard line, so the line's fields are only built when one is written (`report.rs`).
#[derive(Debug, Default)]
pub(super) struct ReportFacts {
    pub(super) endpoint: &'static str,
    pub(super) tenant: Option<Arc<str>>,
    pub(super) request_id: Option<RequestId>,
    pub(super) client_request_id: Option<String>,
    pub(super) trace: Option<Arc<RequestTrace>>,
    /// The request's signals for its pool's window (rollouts count trips and leaks).
    pub(super) signals: Option<Arc<RequestSignals>>,
    /// The request's account (per-tenant accounting): usage, token times, outcome.
    pub(super) ledger: Option<Ledger>,
    /// Set from the answer (dispatch's `ServedBy`).
    pub(super) worker: Option<String>,
    pub(super) prefill_worker: Option<String>,
}

/// What the guard does with one request's answer.
#[derive(Debug)]
pub(super) struct GuardPlan<'a> {
    pub(super) pool: String,
    pub(super) rules: &'a PoolRules,
    /// Whether the I1 checks run; off (only to test other defences), the leak scan alone
    /// still runs.
    pub(super) checks: bool,
    pub(super) shape: Shape,
    /// Set for prefill-only requests: their answers have shapes of their own.
    pub(super) pooling: Option<PoolingShape>,
    /// Set for `/v1/responses`: whether it continues a stored response (`Some(true)`: the
    /// engine's prompt count is held to at least kvgate's).
    pub(super) responses: Option<bool>,
    /// Set for an Anthropic answer the engine wrote itself (`Endpoint::EngineMessages`).
    pub(super) anthropic: bool,
    pub(super) stream: bool,
    pub(super) batch: usize,
    /// Stream usage the gateway asked for on the client's behalf.
    pub(super) rewrite: UsageRewrite,
    /// Where the engine's usage goes (rate-limit settlement).
    pub(super) usage: Option<UsageCell>,
    /// The answer's leak scan, handed over by isolation (taken when the scan starts).
    pub(super) leak: Option<LeakWatch>,
    count: Option<TokenCount>,
    tolerance: u64,
}

impl<'a> GuardPlan<'a> {
    /// The plan for `request` under `pools`' rules, and the facts its report carries;
    /// `None` when its pool's guard and its leak scan are both off and the request has no
    /// account to fill in (nothing to read).
    pub(super) fn read(
        request: &mut Request<Bytes>,
        pools: &'a HashMap<String, PoolRules>,
    ) -> Result<Option<(Self, ReportFacts)>, GatewayError> {
        let route = request.extensions().get::<RoutePlan>();
        let pool = route.map(|p| p.pool.name.to_string()).unwrap_or_default();
        // The pool's latency histograms take the request's token times, whether the guard
        // runs here or not.
        if let Some(ledger) = request.extensions().get::<Ledger>() {
            ledger.route(&pool);
        }
        let chat_rules = route.map(|p| p.pool.count_rules());
        let leak = request.extensions_mut().remove::<LeakWatch>();
        let leak_on = leak.as_ref().is_some_and(|w| w.mode().is_on());
        // A tenant's request is accounted (its tokens, its time to first token) even on a
        // pool whose checks are off: the answer is then read, not checked.
        let accounts = request.extensions().get::<Ledger>().is_some();
        let Some(rules) = pools
            .get(&pool)
            .filter(|r| r.config.enabled || leak_on || accounts)
        else {
            return Ok(None);
        };
        let checks = rules.config.enabled;
        let parsed = request
            .extensions_mut()
            .get_mut::<InferenceRequest>()
            .ok_or_else(|| GatewayError::Internal("the guard ran before parsing".into()))?;
        let shape = if parsed.endpoint == Endpoint::Generate {
            Shape::Native
        } else {
            Shape::OpenAi
        };
        let pooling = match parsed.endpoint {
            Endpoint::Embeddings => Some(PoolingShape::Embeddings),
            Endpoint::Rerank => Some(PoolingShape::Rerank),
            Endpoint::Score => Some(PoolingShape::Score),
            _ => None,
        };
        let (stream, batch, endpoint) = (parsed.stream, parsed.batch, parsed.endpoint);
        let responses = (parsed.endpoint == Endpoint::CreateResponse)
            .then(|| request.extensions().get::<Continuation>().is_some());
        let parsed = request
            .extensions_mut()
            .get_mut::<InferenceRequest>()
            .ok_or_else(|| GatewayError::Internal("the guard ran before parsing".into()))?;
        let anthropic = endpoint == Endpoint::EngineMessages;
        // Usage in the stream: for the count's check, and for the tenant's account.
        let rewrite = if (checks || accounts)
            && stream
            && shape == Shape::OpenAi
            && responses.is_none()
            && !anthropic
        {
            request_stream_usage(parsed)
        } else {
            UsageRewrite::default()
        };
        let tolerance = if parsed.token_id_input() {
            0
        } else {
            rules.config.prompt_tokens_tolerance
        };
        let extensions = request.extensions();
        let facts = ReportFacts {
            endpoint: endpoint.label(),
            tenant: extensions.get::<AuthContext>().map(|a| a.tenant.clone()),
            request_id: extensions.get::<RequestId>().cloned(),
            client_request_id: request
                .headers()
                .get(CLIENT_REQUEST_ID)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            trace: extensions.get::<Arc<RequestTrace>>().cloned(),
            signals: extensions.get::<Arc<RequestSignals>>().cloned(),
            ledger: extensions.get::<Ledger>().cloned(),
            worker: None,
            prefill_worker: None,
        };
        let plan = Self {
            pool,
            rules,
            checks,
            shape,
            pooling,
            responses,
            anthropic,
            stream,
            batch,
            rewrite,
            usage: extensions.get::<UsageCell>().cloned(),
            leak,
            // The count as the serving pool's engine prepares the request.
            count: extensions
                .get::<TokenCount>()
                .map(|c| chat_rules.map_or(c, |r| c.for_rules(r)).clone()),
            tolerance,
        };
        Ok(Some((plan, facts)))
    }

    /// What the engine's counts are checked against: the gateway's own exact count (waits
    /// for the background count if admission settled on the byte bound).
    pub(super) async fn expectation(&self) -> Expectation {
        Expectation {
            prompt_tokens: match (&self.count, self.checks) {
                (Some(c), true) => c.exact().await,
                _ => None,
            },
            tolerance: self.tolerance,
        }
    }
}

/// Ask OpenAI-format engines for usage in the stream (to cross-check the prompt count as
/// early as the first chunk) and remember what the client did not ask for.
fn request_stream_usage(parsed: &mut InferenceRequest) -> UsageRewrite {
    parsed.directives.stream_usage = true;
    UsageRewrite {
        strip_final_usage: !parsed.client_stream_option("include_usage"),
        strip_chunk_usage: !parsed.client_stream_option("continuous_usage_stats"),
    }
}
