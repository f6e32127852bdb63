//! Static endpoints and the split of the stack: `GET /v1/models` and `GET /v1/models/{id}`
//! are answered from the
//! config, listing only the models the caller's tenant may use; inference routes continue down the pipeline; anything else is 404/405 before a
//! body byte is read.

use http::{header, Request, Response};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::body::{self, BoxBody, BoxError};
use crate::error::GatewayError;
use crate::stack::api::{model_id, Endpoint, ModelCatalog};
use crate::stack::auth::AuthContext;
use crate::stack::shell::{BoxedWrap, Inner, ShellFuture, ShellLayer};
use crate::tenant::TenantPolicy;

/// Answers `/v1/models`, rejects unknown routes, passes inference routes on.
#[derive(Debug, Clone)]
pub struct Catalog {
    models: ModelCatalog,
}

impl Catalog {
    /// Serve `models` on `/v1/models`.
    pub fn layer(models: ModelCatalog) -> ShellLayer<Self> {
        ShellLayer::new(Self { models })
    }
}

// === impl Catalog ===

impl BoxedWrap for Catalog {
    type Error = BoxError;

    fn call<S: Inner<B>, B: Send + 'static>(&self, inner: &S, request: Request<B>) -> ShellFuture {
        match Endpoint::classify(request.method(), request.uri().path()) {
            Err(mut e) => {
                // A body the client sent is not read for a route that does not exist: the
                // answer says the connection closes, so keep-alive clients reconnect.
                let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
                    || request
                        .headers()
                        .get(header::CONTENT_LENGTH)
                        .is_some_and(|v| v.as_bytes() != b"0");
                if let GatewayError::RouteNotFound { body_unread, .. }
                | GatewayError::MethodNotAllowed { body_unread, .. } = &mut e
                {
                    *body_unread = has_body;
                }
                Box::pin(async move { Err(e.into()) })
            }
            Ok(Endpoint::ListModels) => {
                let policy = request.extensions().get::<AuthContext>().map(|a| &a.policy);
                let response = list_models(&self.models, policy.map(|p| &**p));
                Box::pin(async move { Ok(response) })
            }
            Ok(Endpoint::RetrieveModel) => {
                let policy = request.extensions().get::<AuthContext>().map(|a| &a.policy);
                let id = model_id(request.uri().path()).unwrap_or_default();
                let response = retrieve_model(&self.models, policy.map(|p| &**p), id);
                Box::pin(async move { response.map_err(Into::into) })
            }
            Ok(_) => {
                let inner = inner.clone();
                Box::pin(async move {
                    use tower::ServiceExt;
                    inner.oneshot(request).await
                })
            }
        }
    }
}

/// OpenAI's model object.
fn model_object(id: &str) -> serde_json::Value {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    json!({"id": id, "object": "model", "created": created, "owned_by": "kvgate"})
}

fn json_response(value: &serde_json::Value) -> Response<BoxBody> {
    body::json_response(value.to_string())
}

fn list_models(models: &ModelCatalog, tenant: Option<&TenantPolicy>) -> Response<BoxBody> {
    let data: Vec<_> = models
        .names()
        .filter(|id| tenant.is_none_or(|t| t.allows_model(id)))
        .map(model_object)
        .collect();
    json_response(&json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: the model object, or 404 `model_not_found` for a model that does
/// not exist or that the tenant may not use (it must not learn which).
fn retrieve_model(
    models: &ModelCatalog,
    tenant: Option<&TenantPolicy>,
    id: String,
) -> Result<Response<BoxBody>, GatewayError> {
    let known = models.names().any(|m| m == id) && tenant.is_none_or(|t| t.allows_model(&id));
    if !known {
        return Err(GatewayError::ModelNotFound { model: id });
    }
    Ok(json_response(&model_object(&id)))
}
