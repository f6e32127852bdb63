//! The global in-flight ceiling (`server.max_in_flight`): a request that finds every slot
//! taken is answered 503 `overloaded` with `Retry-After` at once, before its body is read.
//! The slot lives in the response body, so streams count until they end.

use http::{Request, Response};
use tower::ServiceExt;

use crate::body::{self, BoxError, GuardBody};
use crate::error::GatewayError;
use crate::load::InFlightLimit;
use crate::stack::shell::{BoxedWrap, Inner, ShellFuture, ShellLayer};

/// Refuses requests over the in-flight cap.
#[derive(Debug, Clone)]
pub struct LoadShed {
    limit: InFlightLimit,
}

impl LoadShed {
    /// Shed above `limit`.
    pub fn layer(limit: InFlightLimit) -> ShellLayer<Self> {
        ShellLayer::new(Self { limit })
    }
}

// === impl LoadShed ===

impl BoxedWrap for LoadShed {
    type Error = BoxError;

    fn call<S: Inner<B>, B: Send + 'static>(&self, inner: &S, request: Request<B>) -> ShellFuture {
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
        let inner = inner.clone();
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
