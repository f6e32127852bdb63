//! `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`: asked of the worker that
//! holds the stored response (`ownership` checked the tenant and pinned it), answered as
//! that worker answers, with no prompt to admit and nothing to route.
//!
//! Sits below the rate limits (the tenant's requests per minute hold for these too) and
//! above routing. The answer is read whole within `upstream.max_response_bytes`; an error
//! object inside a 2xx is never passed on as a success (I1).

use bytes::Bytes;
use http::{Request, Response};
use std::sync::Arc;

use crate::body::{self, BoxBody};
use crate::error::GatewayError;
use crate::fleet::{Fleet, PoolWorkers};
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::guard::inspect::error_object;
use crate::stack::routing::PinnedWorker;
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};
use crate::upstream::{read_body, Replay, Upstream};

/// The stored-response stage.
#[derive(Debug, Clone)]
pub struct StoredResponseProxy {
    fleet: Arc<Fleet>,
    upstream: Upstream,
    max_response_bytes: usize,
}

impl StoredResponseProxy {
    /// Ask `fleet`'s workers through `upstream`, reading at most `max_response_bytes`.
    pub fn layer(
        fleet: Arc<Fleet>,
        upstream: Upstream,
        max_response_bytes: usize,
    ) -> StageLayer<Self> {
        StageLayer::new(Self {
            fleet,
            upstream,
            max_response_bytes,
        })
    }
}

impl Stage for StoredResponseProxy {
    fn handle(&self, request: Request<Bytes>, next: Next) -> StageFuture {
        let Some(endpoint) = request
            .extensions()
            .get::<InferenceRequest>()
            .map(|p| p.endpoint)
            .filter(|e| e.is_stored_response())
        else {
            return next.oneshot(request);
        };
        let stage = self.clone();
        Box::pin(async move {
            let pin = request
                .extensions()
                .get::<PinnedWorker>()
                .cloned()
                .ok_or_else(|| GatewayError::Internal("a stored response with no owner".into()))?;
            let gone = || GatewayError::NoEligibleWorker {
                model: String::new(),
                reason: format!(
                    "the worker {} holding response {} is no longer in pool `{}`",
                    pin.authority, pin.response_id, pin.pool
                ),
                retry_after: std::time::Duration::from_secs(1),
            };
            let pool = stage.fleet.pool(&pin.pool).ok_or_else(gone)?;
            let PoolWorkers::Unified(workers) = &pool.workers else {
                return Err(gone().into());
            };
            let worker = workers
                .iter()
                .find(|w| w.authority == pin.authority)
                .ok_or_else(gone)?
                .clone();
            let path = request.uri().path().to_owned();
            let deadline = stage.upstream.deadline();
            let answer = if endpoint == Endpoint::CancelResponse {
                stage
                    .upstream
                    .post_json(
                        worker.as_ref(),
                        &path,
                        Bytes::new(),
                        None,
                        None,
                        deadline,
                        Replay::StaleConnection,
                    )
                    .await?
            } else {
                stage.upstream.get(worker.as_ref(), &path, deadline).await?
            };
            let status = answer.status();
            let bytes = read_body(
                worker.as_ref(),
                answer.into_body(),
                stage.max_response_bytes,
                deadline,
                None,
            )
            .await?;
            if !status.is_success() {
                // As dispatch does: the engine's own text is logged, the client gets the
                // gateway's error for its status.
                let message = String::from_utf8_lossy(&bytes).chars().take(1000).collect();
                return Err(GatewayError::UpstreamStatus {
                    pool: pin.pool.to_string(),
                    role: "unified",
                    status,
                    message,
                }
                .into());
            }
            {
                let trip = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| error_object(&v));
                if let Some(trip) = trip {
                    return Err(GatewayError::UpstreamIntegrity {
                        pool: pin.pool.to_string(),
                        reason: format!("an error inside a {status} answer: {trip:?}"),
                    }
                    .into());
                }
            }
            let mut response = body::json_response(bytes);
            *response.status_mut() = status;
            Ok::<Response<BoxBody>, _>(response)
        })
    }
}
