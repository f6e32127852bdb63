//! The global in-flight ceiling (`server.max_in_flight`): a request that finds every slot
//! taken is answered 503 `overloaded` with `Retry-After` at once, before its body is read.
//! The slot lives in the response body, so streams count until they end.

use futures_util::future::BoxFuture;
use http::{Request, Response};
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceExt};

use crate::body::{self, BoxBody, BoxError, GuardBody};
use crate::error::GatewayError;
use crate::load::InFlightLimit;

/// Layer constructor for [`LoadShed`].
#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    limit: InFlightLimit,
}

impl LoadShedLayer {
    /// Shed above `limit`.
    pub fn new(limit: InFlightLimit) -> Self {
        Self { limit }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;
    fn layer(&self, inner: S) -> LoadShed<S> {
        LoadShed {
            inner,
            limit: self.limit.clone(),
        }
    }
}

/// Refuses requests over the in-flight cap.
#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    limit: InFlightLimit,
}

impl<S, B> Service<Request<B>> for LoadShed<S>
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
        let Some(slot) = self.limit.try_acquire() else {
            ::metrics::counter!(crate::metrics::LOAD_SHED_TOTAL, "ceiling" => "in_flight")
                .increment(1);
            return Box::pin(async {
                Err(GatewayError::Overloaded {
                    ceiling: "in-flight request",
                }
                .into())
            });
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let response = inner.oneshot(request).await?;
            let (parts, body) = response.into_parts();
            Ok(Response::from_parts(
                parts,
                body::boxed(GuardBody::new(body, slot)),
            ))
        })
    }
}
