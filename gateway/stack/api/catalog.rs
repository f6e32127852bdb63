//! Static endpoints and the split of the stack: `GET /v1/models` is answered from the
//! config, listing only the models the caller's tenant may use; inference routes continue down the pipeline; anything else is 404/405 before a
//! body byte is read.

use http::{header, HeaderValue, Request, Response};
use serde_json::json;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::body::{self, BoxBody, BoxError};
use crate::stack::api::{Endpoint, ModelCatalog};
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
            Err(e) => Box::pin(async move { Err(e.into()) }),
            Ok(Endpoint::ListModels) => {
                let policy = request.extensions().get::<AuthContext>().map(|a| &a.policy);
                let response = list_models(&self.models, policy.map(|p| &**p));
                Box::pin(async move { Ok(response) })
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

fn list_models(models: &ModelCatalog, tenant: Option<&TenantPolicy>) -> Response<BoxBody> {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let data: Vec<_> = models
        .names()
        .filter(|id| tenant.is_none_or(|t| t.allows_model(id)))
        .map(|id| json!({"id": id, "object": "model", "created": created, "owned_by": "kvgate"}))
        .collect();
    let mut response = Response::new(body::full(
        json!({"object": "list", "data": data}).to_string(),
    ));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
