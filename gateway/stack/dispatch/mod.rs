//! Dispatch: send the request to the chosen worker(s) and relay the answer.
//!
//! The innermost service of the stack. Unified pools get one POST; disaggregated pools get
//! the same JSON, with bootstrap fields, sent to the prefill and the decode worker at once;
//! the decode side's answer is relayed, and a failure on either side is an error, never a
//! 200. Streams pass through frame by frame; when the client goes away the body is dropped,
//! which closes the upstream connection and so cancels the engine's work.
//!
//! Reads: `InferenceRequest`, `RoutePlan`. The worker loads of the plan ride in the response
//! body and end with it.

mod bootstrap;
mod engine_body;
mod relay;

pub use bootstrap::new_room;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{HeaderValue, Request, Response};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

use crate::body::{BoxBody, BoxError};
use crate::error::GatewayError;
use crate::stack::api::InferenceRequest;
use crate::stack::guard::{PrefillAnswer, ServedBy};
use crate::stack::routing::{RoutePlan, Target};
use crate::upstream::Upstream;

/// Limits on what dispatch reads into memory.
#[derive(Debug, Clone, Copy)]
pub struct DispatchLimits {
    /// Largest non-streaming response body read from an engine.
    pub max_response_bytes: usize,
}

/// The dispatch service.
#[derive(Clone, Debug)]
pub struct Dispatch {
    upstream: Upstream,
    limits: DispatchLimits,
}

impl Dispatch {
    /// Dispatch through `upstream`.
    pub fn new(upstream: Upstream, limits: DispatchLimits) -> Self {
        Self { upstream, limits }
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
        let upstream = self.upstream.clone();
        let limits = self.limits;
        let parsed = request.extensions_mut().remove::<InferenceRequest>();
        let plan = request.extensions_mut().remove::<RoutePlan>();
        let request_id = request.headers().get("x-request-id").cloned();
        Box::pin(async move {
            let (Some(parsed), Some(plan)) = (parsed, plan) else {
                return Err(
                    GatewayError::Internal("dispatch ran before parse/route".into()).into(),
                );
            };
            dispatch(&upstream, limits, parsed, plan, request_id)
                .await
                .map_err(BoxError::from)
        })
    }
}

async fn dispatch(
    upstream: &Upstream,
    limits: DispatchLimits,
    parsed: InferenceRequest,
    plan: RoutePlan,
    request_id: Option<HeaderValue>,
) -> Result<Response<BoxBody>, GatewayError> {
    let deadline = upstream.deadline();
    let path = parsed.endpoint.path();
    let stream = parsed.stream;
    let prefill_worker = match plan.target.as_ref() {
        Target::Unified(_) => None,
        Target::Disaggregated { prefill, .. } => Some(&**prefill.worker()),
    };
    // The engine's body, built once from the typed request (both PD legs get these bytes).
    let bytes = engine_body::build(parsed, &plan.pool.served_model, prefill_worker)?;
    let relay = relay::Relay {
        stream,
        limits,
        deadline,
        pool: plan.pool.clone(),
        guard: plan.target.clone(),
    };
    match plan.target.as_ref() {
        Target::Unified(load) => {
            let response = upstream
                .post_json(load.worker(), path, bytes, request_id.as_ref(), deadline)
                .await;
            let mut answer = relay.answer(load.worker(), response).await?;
            answer.extensions_mut().insert(ServedBy {
                worker: load.worker().authority.clone(),
                prefill: None,
            });
            Ok(answer)
        }
        Target::Disaggregated { prefill, decode } => {
            let prefill_leg = async {
                let response = upstream
                    .post_json(
                        prefill.worker(),
                        path,
                        bytes.clone(),
                        request_id.as_ref(),
                        deadline,
                    )
                    .await;
                relay.drain_prefill(prefill.worker(), response).await
            };
            let decode_leg = upstream.post_json(
                decode.worker(),
                path,
                bytes.clone(),
                request_id.as_ref(),
                deadline,
            );
            // Both at once: the decode worker waits for the KV that the prefill worker sends.
            let (prefill_result, decode_response) = tokio::join!(prefill_leg, decode_leg);
            // A failed prefill fails the request even when decode answered (dropping the
            // decode response closes its connection and cancels it).
            let prefill_answer = prefill_result?;
            let mut answer = relay.answer(decode.worker(), decode_response).await?;
            // The guard checks the prefill leg too: an abort there fails the request even
            // when decode says 200.
            answer
                .extensions_mut()
                .insert(PrefillAnswer(prefill_answer));
            answer.extensions_mut().insert(ServedBy {
                worker: decode.worker().authority.clone(),
                prefill: Some(prefill.worker().authority.clone()),
            });
            Ok(answer)
        }
    }
}

/// Keep the target alive in the body: the worker loads end when the stream ends.
pub(crate) type TargetGuard = Arc<Target>;
