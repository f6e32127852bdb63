//! Who may name a stored response, and where a request naming one goes.
//!
//! For `/v1/responses`: kvgate names every response itself (`resp_<request id>`, sent as
//! SGLang's `request_id`; a client's own `request_id` is refused), and once a worker has
//! answered one with `store` on (SGLang's default) it records the owner: tenant, pool and
//! worker. A request naming a stored response — `previous_response_id`, `GET
//! /v1/responses/{id}`, `POST /v1/responses/{id}/cancel` — is looked up first: another
//! tenant's id, or one kvgate never recorded, is 404 `response_not_found` (as if it did not
//! exist), an owner map that cannot answer is 503; otherwise the request is pinned to the
//! owner's worker (routing's `PinnedWorker`: routing takes that worker or none, dispatch never
//! retries elsewhere), since SGLang keeps the stored conversation in that one process.
//!
//! Fail-closed without a copy of the stored conversation: kvgate counts a continuation's
//! new input (and instructions, tools) exactly and admits on that, a lower bound of the
//! prompt; the stored part is counted by the one engine that holds it, which refuses a
//! prompt over its context (`_validate_one_request`), and the guard turns any refusal,
//! abort or failed status inside a 200 into an error, and an `input_tokens` below kvgate's
//! count of the new part into an integrity error ([`Continuation`]).
//!
//! Reads: `InferenceRequest`, `AuthContext`, `RequestId`; the answer's `ServedBy` and
//! `x-kvgate-pool`. Writes: `PinnedWorker`, `Continuation`, the `response_id` directive.

use bytes::Bytes;
use http::Request;
use serde_json::Value;
use std::sync::Arc;

use super::owners::{OwnersError, ResponseOwner, ResponseOwners};
use crate::error::GatewayError;
use crate::fleet::Fleet;
use crate::stack::api::{stored_response, Endpoint, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::request_id::RequestId;
use crate::stack::routing::{PinnedWorker, ServedBy};
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};

/// A `/v1/responses` request continuing a stored response: kvgate counted only its new
/// part, so the engine's `input_tokens` is held to at least that count.
#[derive(Debug, Clone, Copy)]
pub struct Continuation;

/// The ownership stage.
#[derive(Debug, Clone)]
pub struct ResponseOwnership {
    owners: Arc<ResponseOwners>,
    fleet: Arc<Fleet>,
}

impl ResponseOwnership {
    /// Check and record owners in `owners`; find their pools in `fleet`.
    pub fn layer(owners: Arc<ResponseOwners>, fleet: Arc<Fleet>) -> StageLayer<Self> {
        StageLayer::new(Self { owners, fleet })
    }
}

impl Stage for ResponseOwnership {
    fn handle(&self, mut request: Request<Bytes>, next: Next) -> StageFuture {
        let Some(endpoint) = request
            .extensions()
            .get::<InferenceRequest>()
            .map(|p| p.endpoint)
            .filter(|e| *e == Endpoint::CreateResponse || e.is_stored_response())
        else {
            return next.oneshot(request);
        };
        let stage = self.clone();
        Box::pin(async move {
            let tenant = request.extensions().get::<AuthContext>().map_or_else(
                || crate::tenant::ANONYMOUS_TENANT.to_owned(),
                |a| a.tenant.to_string(),
            );
            let named = match endpoint {
                Endpoint::CreateResponse => match request
                    .extensions()
                    .get::<InferenceRequest>()
                    .and_then(|p| p.fields.get("previous_response_id"))
                {
                    None | Some(Value::Null) => None,
                    Some(Value::String(id)) => Some(id.clone()),
                    Some(_) => {
                        return Err(GatewayError::invalid(
                            "`previous_response_id` must be a string",
                            Some("previous_response_id"),
                        )
                        .into())
                    }
                },
                _ => stored_response(request.uri().path()).map(|(id, _)| id.to_owned()),
            };
            if let Some(id) = named {
                let owner = stage.owner(&id, &tenant).await?;
                let pool = stage
                    .fleet
                    .pool(&owner.pool)
                    .ok_or_else(|| GatewayError::ResponseNotFound { id: id.clone() })?
                    .clone();
                let parsed = request
                    .extensions_mut()
                    .get_mut::<InferenceRequest>()
                    .ok_or_else(|| GatewayError::Internal("ownership ran before parsing".into()))?;
                if endpoint.is_stored_response() {
                    parsed.model = pool.model.clone();
                } else if parsed.model != pool.model {
                    // Stored under another model: not a response this request can continue.
                    return Err(GatewayError::ResponseNotFound { id }.into());
                }
                request.extensions_mut().insert(PinnedWorker {
                    pool: pool.name.clone(),
                    authority: owner.worker.clone(),
                    response_id: id,
                });
                if endpoint == Endpoint::CreateResponse {
                    request.extensions_mut().insert(Continuation);
                }
            }
            if endpoint != Endpoint::CreateResponse {
                return next.oneshot(request).await;
            }
            let id = format!(
                "resp_{}",
                RequestId::of(&request)
                    .map_or_else(crate::secure_random::hex_id, |r| r.as_str().to_owned())
            );
            let store = {
                let parsed = request
                    .extensions_mut()
                    .get_mut::<InferenceRequest>()
                    .ok_or_else(|| GatewayError::Internal("ownership ran before parsing".into()))?;
                parsed.directives.response_id = Some(id.clone());
                parsed.fields.get("store").and_then(Value::as_bool) != Some(false)
            };
            let response = next.oneshot(request).await?;
            if store && response.status().is_success() {
                let served = response.extensions().get::<ServedBy>();
                let pool = response
                    .headers()
                    .get("x-kvgate-pool")
                    .and_then(|v| v.to_str().ok());
                if let (Some(served), Some(pool)) = (served, pool) {
                    let owner = ResponseOwner {
                        tenant,
                        pool: pool.to_owned(),
                        worker: served.worker.authority.clone(),
                        tokens: 0,
                    };
                    if let Err(e) = stage.owners.record(&id, owner).await {
                        // Kept in this replica's memory; other replicas will answer 404.
                        tracing::warn!(error = %e, response_id = id.as_str(), "recording a stored response's owner failed");
                        ::metrics::counter!(crate::metrics::RESPONSE_OWNER_WRITE_FAILURES_TOTAL)
                            .increment(1);
                    }
                }
            }
            Ok(response)
        })
    }
}

impl ResponseOwnership {
    /// The owner of `id` when `tenant` created it; 404 otherwise, 503 when the map cannot
    /// answer.
    async fn owner(&self, id: &str, tenant: &str) -> Result<ResponseOwner, GatewayError> {
        match self.owners.lookup_for(id, tenant).await {
            Ok(Some(owner)) => Ok(owner),
            Ok(None) | Err(OwnersError::InvalidId) => Err(GatewayError::ResponseNotFound {
                id: id.chars().take(256).collect(),
            }),
            Err(e) => Err(GatewayError::ResponseOwnersUnavailable {
                id: id.to_owned(),
                detail: e.to_string(),
            }),
        }
    }
}
