//! Static endpoints and the split of the stack: `GET /v1/models` is answered from the
//! config, listing only the models the caller's tenant may use; inference routes continue down the pipeline; anything else is 404/405 before a
//! body byte is read.

use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Request, Response};
use serde_json::json;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};
use tower::{Layer, Service};

use crate::body::{self, BoxBody, BoxError};
use crate::stack::api::{Endpoint, ModelCatalog};
use crate::stack::auth::AuthContext;
use crate::tenant::TenantPolicy;

/// Layer constructor for [`Catalog`].
#[derive(Debug, Clone)]
pub struct CatalogLayer {
    models: ModelCatalog,
}

impl CatalogLayer {
    /// Serve `models` on `/v1/models`.
    pub fn new(models: ModelCatalog) -> Self {
        Self { models }
    }
}

impl<S> Layer<S> for CatalogLayer {
    type Service = Catalog<S>;
    fn layer(&self, inner: S) -> Catalog<S> {
        Catalog {
            inner,
            models: self.models.clone(),
        }
    }
}

/// Answers `/v1/models`, rejects unknown routes, passes inference routes on.
#[derive(Debug, Clone)]
pub struct Catalog<S> {
    inner: S,
    models: ModelCatalog,
}

// === impl Catalog ===

impl<S, B> Service<Request<B>> for Catalog<S>
where
    S: Service<Request<B>, Response = Response<BoxBody>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Response<BoxBody>, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match Endpoint::classify(request.method(), request.uri().path()) {
            Err(e) => Box::pin(async move { Err(e.into()) }),
            Ok(Endpoint::ListModels) => {
                let policy = request.extensions().get::<AuthContext>().map(|a| &a.policy);
                let response = list_models(&self.models, policy.map(|p| &**p));
                Box::pin(async move { Ok(response) })
            }
            Ok(_) => {
                let inner = self.inner.clone();
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
