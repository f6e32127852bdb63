//! Rescue: the outermost gateway layer. Turns every error raised below into its HTTP
//! response (through [`GatewayError::into_response`], the one place that builds error
//! bodies) and counts each request's single outcome (I6). The stack above it is infallible.

use futures_util::future::BoxFuture;
use http::{Request, Response};
use std::convert::Infallible;
use std::task::{Context, Poll};
use std::time::Instant;
use tower::{Layer, Service};

use crate::api::Endpoint;
use crate::body::{BoxBody, BoxError};
use crate::error::GatewayError;
use crate::metrics;

/// Layer constructor for [`Rescue`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RescueLayer;

impl<S> Layer<S> for RescueLayer {
    type Service = Rescue<S>;
    fn layer(&self, inner: S) -> Rescue<S> {
        Rescue { inner }
    }
}

/// Errors → responses, plus outcome metrics.
#[derive(Debug, Clone)]
pub struct Rescue<S> {
    inner: S,
}

// === impl Rescue ===

impl<S, B> Service<Request<B>> for Rescue<S>
where
    S: Service<Request<B>, Response = Response<BoxBody>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<BoxBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The stages below are always ready; readiness is driven per call in `oneshot`.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let inner = self.inner.clone();
        let endpoint = Endpoint::classify(request.method(), request.uri().path())
            .map(Endpoint::label)
            .unwrap_or("other");
        let started = Instant::now();
        Box::pin(async move {
            use tower::ServiceExt;
            let response = match inner.oneshot(request).await {
                Ok(response) => response,
                Err(error) => {
                    let error = GatewayError::from_boxed(error);
                    ::metrics::counter!(metrics::ERRORS_TOTAL, "code" => error.code()).increment(1);
                    if error.status().is_server_error() {
                        tracing::warn!(%error, code = error.code(), "request failed");
                    } else {
                        tracing::debug!(%error, code = error.code(), "request refused");
                    }
                    error.into_response()
                }
            };
            ::metrics::counter!(
                metrics::REQUESTS_TOTAL,
                "endpoint" => endpoint,
                "status" => response.status().as_str().to_owned()
            )
            .increment(1);
            ::metrics::histogram!(metrics::REQUEST_DURATION_SECONDS, "endpoint" => endpoint)
                .record(started.elapsed().as_secs_f64());
            Ok(response)
        })
    }
}
