//! Dispatch: send the request to the chosen worker(s) and relay the answer.
//!
//! The innermost service of the stack. Unified pools get one POST; disaggregated pools get
//! the same JSON, with bootstrap fields, sent to the prefill and the decode worker at once;
//! the decode side's answer is relayed, and a failure on either side is an error, never a
//! 200 — and the first failure ends the request at once, cancelling the other leg (dropping
//! its exchange closes the connection). A unified request whose connection could not be
//! made (nothing was sent) is retried once on another eligible worker of its pool, within
//! the retry budget; nothing is retried once bytes went out, and PD pairs never are (their
//! bootstrap fields name the prefill worker). Streams pass through frame by frame under the
//! stream deadlines; when the client goes away the body is dropped, which closes the
//! upstream connection and so cancels the engine's work.
//!
//! Reads: `InferenceRequest`, `RoutePlan`, the request's buffer reservation. The worker
//! loads of the plan ride in the response body and end with it.

mod bootstrap;
mod engine_body;
mod leg;
mod relay;

pub use bootstrap::new_room;
/// The engine body dispatch sends, for `kvgate preflight` to probe with exactly that.
pub use engine_body::build as build_engine_body;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};
use tower::Service;

use crate::body::{BoxBody, BoxError};
use crate::error::GatewayError;
use crate::fleet::ShareHold;
use crate::load::{BufferBudget, BufferPermit, InFlightSlot};
use crate::metrics;
use crate::stack::api::InferenceRequest;
use crate::stack::auth::AuthContext;
use crate::stack::guard::PrefillAnswer;
use crate::stack::request_id::RequestId;
use crate::stack::routing::{pick_other_unified, RoutePlan, ServedBy, Target};
use crate::telemetry::{Propagation, RequestTrace};
use crate::upstream::{Peer, Replay, Upstream};
use leg::Leg;

/// Limits on what dispatch reads into memory, and its retries.
#[derive(Debug, Clone)]
pub struct DispatchLimits {
    /// Largest non-streaming response body read from an engine.
    pub max_response_bytes: usize,
    /// The shared budget non-streamed answers are reserved from.
    pub budget: BufferBudget,
    /// Retries after a connect failure, as a share of requests (`upstream.retry_budget_ratio`).
    pub retry_ratio: f32,
}

/// The dispatch service.
#[derive(Clone)]
pub struct Dispatch {
    upstream: Upstream,
    limits: DispatchLimits,
    retries: Arc<TpsBudget>,
}

impl std::fmt::Debug for Dispatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatch")
            .field("limits", &self.limits)
            .finish()
    }
}

impl Dispatch {
    /// Dispatch through `upstream`.
    pub fn new(upstream: Upstream, limits: DispatchLimits) -> Self {
        // Deposits live 10 s; one retry per second is always allowed.
        let retries = Arc::new(TpsBudget::new(
            Duration::from_secs(10),
            1,
            limits.retry_ratio,
        ));
        Self {
            upstream,
            limits,
            retries,
        }
    }
}

// === impl Dispatch ===

impl Service<Request<Bytes>> for Dispatch {
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<BoxBody>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Always ready: worker capacity is chosen per request by routing (axum's advice:
        // routing and backpressure don't mix).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Bytes>) -> Self::Future {
        let this = self.clone();
        let parsed = request.extensions_mut().remove::<InferenceRequest>();
        let plan = request.extensions_mut().remove::<RoutePlan>();
        // The request body's reservation is held until the engine has its bytes.
        let held = request.extensions_mut().remove::<Arc<BufferPermit>>();
        let request_id = RequestId::of(&request).map(|id| id.header_value().clone());
        let trace = request.extensions_mut().remove::<Arc<RequestTrace>>();
        let tenant = request
            .extensions()
            .get::<AuthContext>()
            .map(|c| c.tenant.clone());
        drop(request);
        Box::pin(async move {
            let (Some(parsed), Some(plan)) = (parsed, plan) else {
                return Err(
                    GatewayError::Internal("dispatch ran before parse/route".into()).into(),
                );
            };
            let answer = this.dispatch(parsed, plan, request_id, tenant, trace).await;
            drop(held);
            answer.map_err(BoxError::from)
        })
    }
}

impl Dispatch {
    async fn dispatch(
        &self,
        parsed: InferenceRequest,
        plan: RoutePlan,
        request_id: Option<HeaderValue>,
        tenant: Option<Arc<str>>,
        trace: Option<Arc<RequestTrace>>,
    ) -> Result<Response<BoxBody>, GatewayError> {
        let trace = trace.as_ref();
        let tenant = tenant.as_ref();
        let upstream = &self.upstream;
        let deadlines = upstream.deadlines(parsed.stream);
        let path = parsed.endpoint.path();
        let rid = request_id
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .unwrap_or_else(crate::secure_random::hex_id);
        let relay = relay::Relay {
            stream: parsed.stream,
            limits: self.limits.clone(),
            deadlines,
            pool: plan.pool.clone(),
            request_id: request_id.clone(),
        };
        let post = Post {
            upstream,
            path,
            request_id: request_id.as_ref(),
            deadline: deadlines.headers,
        };
        let RoutePlan {
            pool,
            target,
            slot,
            cost,
            overcommit,
            share,
            prefix_keys,
            pinned,
        } = plan;
        match target.as_ref() {
            Target::Unified(load) => {
                // The engine's body, built once from the typed request.
                let bytes = engine_body::build(parsed, &pool, None, &rid)?;
                self.retries.deposit();
                let mut worker = load.worker().clone();
                let mut target = target.clone();
                let mut leg = Leg::start(&worker, tenant, trace);
                let mut response = post
                    .send(
                        &worker,
                        bytes.clone(),
                        leg.propagation().as_ref(),
                        Replay::StaleConnection,
                    )
                    .await;
                if let Err(e @ GatewayError::UpstreamUnavailable { connect: true, .. }) = &response
                {
                    // Nothing was sent: another worker may take it, if the budget allows.
                    if let Some(other) =
                        pick_other_unified(&pool, &worker, cost, overcommit, prefix_keys.as_ref())
                            .filter(|_| !pinned && self.retries.withdraw())
                    {
                        tracing::warn!(error = %e, request_id = rid.as_str(), "connect failed; retrying on another worker");
                        ::metrics::counter!(metrics::UPSTREAM_RETRIES_TOTAL, "pool" => pool.name.to_string(), "reason" => "connect")
                            .increment(1);
                        leg.finish(e.code());
                        let Target::Unified(load) = &other else {
                            return Err(GatewayError::Internal(
                                "a unified pool picked a PD pair".into(),
                            ));
                        };
                        worker = load.worker().clone();
                        // The failed worker's load ends now, not with the answer.
                        target = Arc::new(other);
                        leg = Leg::start(&worker, tenant, trace);
                        response = post
                            .send(
                                &worker,
                                bytes,
                                leg.propagation().as_ref(),
                                Replay::StaleConnection,
                            )
                            .await;
                    }
                }
                let guard = TargetGuard::new(target, slot, share);
                let mut answer = relay.answer(&worker, &mut leg, response, guard).await?;
                leg.finish("ok");
                answer.extensions_mut().insert(ServedBy {
                    worker,
                    prefill: None,
                });
                Ok(answer)
            }
            Target::Disaggregated { prefill, decode } => {
                let bytes = engine_body::build(parsed, &pool, Some(prefill.worker()), &rid)?;
                let guard = TargetGuard::new(target.clone(), slot, share);
                let mut decode_count = Leg::start(decode.worker(), tenant, trace);
                // Each leg is its own span: the engines' traceparents name different parents.
                let decode_trace = decode_count.propagation();
                let prefill_leg = async {
                    let leg = Leg::start(prefill.worker(), tenant, trace);
                    let response = post
                        .send(
                            prefill.worker(),
                            bytes.clone(),
                            leg.propagation().as_ref(),
                            Replay::Never,
                        )
                        .await;
                    let drained = relay.drain_prefill(prefill.worker(), leg, response).await;
                    // The prefill worker's KV went to decode (or nowhere): its share ends
                    // with its leg, not with the decode stream.
                    prefill.release_kv();
                    drained
                };
                let decode_leg = async {
                    let response = post
                        .send(
                            decode.worker(),
                            bytes.clone(),
                            decode_trace.as_ref(),
                            Replay::Never,
                        )
                        .await;
                    relay
                        .answer(decode.worker(), &mut decode_count, response, guard)
                        .await
                };
                // Both at once (the decode worker waits for the KV the prefill worker sends);
                // the first failure wins and drops the other leg, which cancels it.
                let joined = futures_util::future::try_join(prefill_leg, decode_leg).await;
                let ((prefill_answer, held), mut answer) = joined?;
                decode_count.finish("ok");
                // The guard checks the prefill leg too: an abort there fails the request even
                // when decode says 200.
                answer
                    .extensions_mut()
                    .insert(PrefillAnswer(prefill_answer, Arc::new(held)));
                answer.extensions_mut().insert(ServedBy {
                    worker: decode.worker().clone(),
                    prefill: Some(prefill.worker().clone()),
                });
                Ok(answer)
            }
        }
    }
}

/// What every engine POST of one request shares: the engine path, the request id and the
/// deadline for the response headers. Each leg (and the unified retry) sends through it.
struct Post<'a> {
    upstream: &'a Upstream,
    path: &'a str,
    request_id: Option<&'a HeaderValue>,
    deadline: Instant,
}

impl Post<'_> {
    /// POST `body` to `worker`; `trace` continues the leg's span, `replay` says whether a
    /// stale pooled connection may be retried.
    async fn send(
        &self,
        worker: &dyn Peer,
        body: Bytes,
        trace: Option<&Propagation>,
        replay: Replay,
    ) -> Result<Response<Incoming>, GatewayError> {
        self.upstream
            .post_json(
                worker,
                self.path,
                body,
                self.request_id,
                trace,
                self.deadline,
                replay,
            )
            .await
    }
}

/// Kept alive in the body: the worker loads, the pool's in-flight slot and the tenant's
/// share of the pool end when the stream ends.
#[derive(Debug, Clone)]
pub(crate) struct TargetGuard {
    // Fields drop in order: the tenant's share first, so that when the workers' room is
    // given back (and the waiting requests pump), the room kept for the tenant already
    // counts it (`fleet::share`).
    _share: Option<Arc<ShareHold>>,
    _target: Arc<Target>,
    _slot: Option<Arc<InFlightSlot>>,
}

impl TargetGuard {
    fn new(
        target: Arc<Target>,
        slot: Option<Arc<InFlightSlot>>,
        share: Option<Arc<ShareHold>>,
    ) -> Self {
        Self {
            _share: share,
            _target: target,
            _slot: slot,
        }
    }
}
