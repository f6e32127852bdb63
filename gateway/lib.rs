//! kvgate: a multi-tenant admission and isolation gateway for LLM inference engines.
//!
//! The request path is one Tower stack, composed in [`build_stack`] and nowhere else. Each
//! layer below is one module under `stack/`, named as the stage is, in this order:
//!
//! ```text
//! sensitive headers   keys never reach logs                      (tower-http)
//! stack::request_id   the gateway's own id; the client's is echoed, never forwarded
//! stack::trace_context W3C traceparent in, the request's trace and its server span
//! trace               one span per request                       (tower-http)
//! catch panic         a bug answers 500, never a dropped socket  (tower-http, I6)
//! stack::rescue       errors → OpenAI JSON, one outcome per request (I6)
//! stack::load_shed    global in-flight ceiling: 503 at once, no queue
//! stack::header_limits header values and block over their limits: 431
//! stack::auth         API key → tenant and its policy; 401 before the body is read
//! stack::api          catalog (/v1/models, 404/405), read_body (413, 408, budget), parse →
//!                     InferenceRequest (the field allowlist: 400 unsupported_parameter)
//! stack::tenant_rules models and LoRA adapters the tenant may use (403); its priority class
//!                     (x-kvgate-priority within its max_priority: 403, else 400)
//! stack::admission    exact token count vs. every pool's smallest KV bound: 400 before dispatch (I2)
//! stack::rate_limit   tenant RPM/TPM/concurrency; the permit lives in the response body (429)
//! stack::routing      pool by weight (sticky per tenant) or by x-kvgate-pool among the
//!                     admitted; the eligible workers with the most KV room (I3), else a
//!                     turn in the pool's weighted-fair queue (503 when it gives none)
//! stack::observe      the outcome of each routed request in its pool's window (rollouts)
//! stack::isolate      the tenant's cache salt, prompt fingerprints for the leak detector (I5)
//! stack::guard        aborts, placeholders, count mismatch, foreign data: never a false 2xx (I1)
//! stack::stage_span   (around admission, rate limit, route, guard) one span per stage
//! stack::dispatch     builds the engine body once; unified or prefill/decode legs, deadlines
//! ```
//!
//! The stack is built from two inputs ([`build_stack`]`(&shared, &generation)`):
//! [`shared::Shared`], what the process keeps for its whole life (limits and their store,
//! the audit log, the engine client, ceilings, trace export, isolation's memory), and
//! [`generation::Generation`], what one config builds and a reload replaces whole (keys,
//! catalog, fleet, rollouts, admission, guard and isolation settings).
//!
//! Around the stack, each room with one job; arrows point one way (checked by
//! `.ci/layout_check.py`: no import cycle between files, no stage imports `rollout` or
//! `runtime`):
//!
//! ```text
//! fleet/      pools and workers between requests: discovery, health probes, outlier
//!             ejection, versions, drains, each pool's signal window (the stack reads it)
//! rollout/    canary rollouts over the fleet's windows (decide, controller, Redis sharing)
//! runtime/    process/ (assembly, generations, reload, background loops), listener/
//!             (accept, TLS, data threads, deadlines), admin/ (routes, API, status page),
//!             error (why a start or reload failed)
//! commands/   `kvgate check`, `preflight`, `demo`
//! config/     typed, validated TOML: one file per section with its own rules
//! ```
//!
//! Shared building blocks: `error` (the one error type and its HTTP mapping), `body`,
//! `metrics`, `audit`, `activity` (recent counts for the status page), `tenant` (a tenant's
//! policy and limits), `load` (in-flight caps and the buffer budget), `secure_random`,
//! `telemetry` (trace context, spans, OTLP export), `upstream` (the one engine client) and
//! `tls` (the certificates that reload), `dns` (engines discovered by DNS names). The tokenizer and the simulated engine are crates
//! of their own (`crates/tokenize`, `crates/sim`).
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod accounting;
pub mod activity;
pub mod anthropic;
pub mod audit;
pub mod body;
pub mod commands;
pub mod config;
pub mod dns;
pub mod error;
pub mod fleet;
pub mod generation;
pub mod load;
pub mod metrics;
pub mod redis_link;
pub mod rollout;
pub mod runtime;
pub mod secure_random;
pub mod shared;
pub mod stack;
pub mod telemetry;
pub mod tenant;
pub mod tls;
pub mod upstream;
pub mod vision;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use std::any::Any;
use std::convert::Infallible;
use std::sync::Arc;
use tower::{Service, ServiceBuilder};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::TraceLayer;

use crate::body::{BoxBody, BoxError};
use crate::error::GatewayError;
use crate::generation::Generation;
use crate::shared::Shared;
use crate::stack::admission::Admit;
use crate::stack::anthropic_reply::AnthropicReply;
use crate::stack::api::catalog::Catalog;
use crate::stack::api::read_body::ReadBody;
use crate::stack::api::Parse;
use crate::stack::auth::Authenticate;
use crate::stack::dispatch::Dispatch;
use crate::stack::guard::Guard;
use crate::stack::isolate::Isolate;
use crate::stack::load_shed::LoadShed;
use crate::stack::local_answer::LocalAnswer;
use crate::stack::observe::Observe;
use crate::stack::rate_limit::RateLimit;
use crate::stack::request_id::RequestIdLayer;
use crate::stack::rescue::Rescue;
use crate::stack::responses::{ResponseOwnership, StoredResponseProxy};
use crate::stack::routing::{PrefixRouting, Route, Scheduling};
use crate::stack::stage_span::{StageName, StageSpanLayer};
use crate::stack::tenant_rules::TenantRules;
use crate::stack::trace_context::TraceContext;

/// The data-port request path, outermost layer first, built from the process's
/// [`Shared`] state and one config's [`Generation`] (a reload builds it again with the next
/// generation; requests in flight keep the stack they started on).
pub fn build_stack<B>(
    shared: &Shared,
    generation: &Generation,
) -> impl Service<
    Request<B>,
    Response = Response<impl Body<Data = Bytes, Error: Into<BoxError>> + Send + 'static>,
    Error = Infallible,
    Future: Send + 'static,
> + Clone
       + Send
       + 'static
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    ServiceBuilder::new()
        // Keys never reach logs: mark them sensitive before anything can record headers.
        .layer(SetSensitiveRequestHeadersLayer::new([
            http::header::AUTHORIZATION,
            http::HeaderName::from_static("x-api-key"),
        ]))
        // Every request gets the gateway's own id first, so logs, engine requests and errors
        // share it; the client's id is echoed as x-client-request-id, never forwarded.
        .layer(RequestIdLayer)
        // The request's trace (the client's traceparent, or a sampled new one) and its server
        // span, parent of every stage and engine span; needs the request id, and sits above
        // everything so the span covers every outcome, rescued errors included.
        .layer(TraceContext::layer(shared.telemetry.clone()))
        // One span per request covering everything below.
        .layer(TraceLayer::new_for_http())
        // A bug below answers 500 instead of dropping the connection without a status (I6).
        .layer(CatchPanicLayer::custom(panic_response))
        // Errors become OpenAI-style JSON here and only here; every outcome is counted once.
        .layer(Rescue::layer(
            shared.audit.clone(),
            shared.activity.clone(),
            shared.accounting.clone(),
        ))
        // Over the global in-flight ceiling: 503 at once, before any work.
        .layer(LoadShed::layer(shared.in_flight.clone()))
        // 431 for a header value or block over its limit.
        .layer(shared.headers.layer())
        // 401 before the body is read: strangers cannot make us buffer 64 MiB.
        .layer(Authenticate::layer(generation.keys.clone()))
        // `/v1/models` and 404/405 need no body.
        .layer(Catalog::layer(generation.catalog.clone()))
        // Counting tokens needs the whole JSON; bounded (413), with deadlines (408), inside
        // the shared buffer budget (503).
        .layer(ReadBody::layer(shared.body.clone()))
        // One request model for chat, completions and /generate.
        .layer(Parse::layer(generation.catalog.clone()))
        // 403 for models the tenant may not use, before any tokenizing.
        .layer(TenantRules::layer())
        // A request naming a stored response (`previous_response_id`, GET/cancel) belongs
        // to its tenant (404 for another) and is pinned to the worker that holds it;
        // kvgate names every new response and records its owner.
        .layer(ResponseOwnership::layer(
            shared.responses.clone(),
            generation.fleet.clone(),
        ))
        // Exact token counts against every pool's smallest KV bound: 400 before any byte
        // goes downstream (I2); inserts TokenCount and the admitted pools.
        .layer(StageSpanLayer::new(
            StageName::Admission,
            Admit::layer(generation.admission.clone()),
        ))
        // Anthropic clients get Anthropic answers: `/v1/messages` ran as the chat it was
        // translated to, and its (guarded) answer or stream is translated back here.
        .layer(AnthropicReply::layer())
        // Tenant RPM/TPM/concurrency: reserves admission's count; the permit lives in the
        // response body (slot until the stream ends; tokens settled with engine usage).
        .layer(StageSpanLayer::new(
            StageName::RateLimit,
            RateLimit::layer(shared.limiter.clone()),
        ))
        // `/tokenize` and `/detokenize` are answered here from the model's tokenizer: they
        // hold a rate-limit slot, never an engine.
        .layer(LocalAnswer::layer(generation.admission.clone()))
        // A stored response's GET and cancel: asked of the worker that holds it.
        .layer(StoredResponseProxy::layer(
            generation.fleet.clone(),
            shared.upstream.clone(),
            shared.dispatch.max_response_bytes,
        ))
        // Pool by weight, then the eligible workers with the most KV room (I3: unknown
        // capacity never serves), the one holding the prompt's prefix first within a load
        // margin ([prefix_routing]); with none, a turn in the pool's fair queue ([scheduling]).
        .layer(StageSpanLayer::new(
            StageName::Route,
            Route::layer(
                generation.fleet.clone(),
                Scheduling::from_config(&generation.config.scheduling)
                    .with_tenants(generation.config.tenants.len()),
                PrefixRouting::from_config(
                    &generation.config.prefix_routing,
                    Arc::new(shared.isolation.salter.clone()),
                ),
                shared.audit.clone(),
            ),
        ))
        // Every routed request's outcome counts in its pool's window: canary rollouts roll
        // back on these, the admin port shows them.
        .layer(Observe::layer(generation.rollouts.clone()))
        // Tenant cache namespaces (strip client keys, inject our salt) and prompt
        // fingerprints for the leak detector; needs the pool, so after routing (I5).
        .layer(Isolate::layer(generation.isolation.clone()))
        // Reads every engine answer, the prefill leg included: no abort, placeholder or
        // foreign data leaves as a success (I1).
        .layer(StageSpanLayer::new(
            StageName::Guard,
            Guard::layer(generation.guard.clone()),
        ))
        .service(Dispatch::new(
            shared.upstream.clone(),
            shared.dispatch.clone(),
        ))
}

fn panic_response(panic: Box<dyn Any + Send + 'static>) -> Response<BoxBody> {
    let detail = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned());
    tracing::error!(%detail, "request handler panicked");
    GatewayError::Internal("the gateway hit an internal error".into()).into_response(None)
}
