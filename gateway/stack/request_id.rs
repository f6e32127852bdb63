//! Request ids: the gateway generates every request's id; the client's never reaches an
//! engine.
//!
//! A client's `x-request-id` is moved to `x-client-request-id` (kept for the logs and
//! echoed back when it is short, printable ASCII; dropped otherwise), and the request gets
//! a fresh 128-bit id from the CSPRNG as its `x-request-id`. Everything below — logs, audit
//! lines, error bodies, the engine's `rid` and `x-request-id` — uses the gateway's id, so
//! no tenant can make an engine confuse its request with another's. The response carries
//! both headers.

use http::{HeaderName, HeaderValue, Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower::{Layer, Service};

use crate::secure_random;

/// The gateway's request id header (request and response).
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// The client's own id, echoed back.
pub const CLIENT_REQUEST_ID: HeaderName = HeaderName::from_static("x-client-request-id");

/// Longest client id kept.
const MAX_CLIENT_ID_BYTES: usize = 128;

/// Layer constructor for [`RequestIds`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestIdLayer;

impl<S> Layer<S> for RequestIdLayer {
    type Service = RequestIds<S>;
    fn layer(&self, inner: S) -> RequestIds<S> {
        RequestIds { inner }
    }
}

/// Replaces the client's request id with the gateway's own.
#[derive(Debug, Clone)]
pub struct RequestIds<S> {
    inner: S,
}

fn client_id(value: &HeaderValue) -> Option<HeaderValue> {
    let bytes = value.as_bytes();
    let printable = bytes.iter().all(|b| b.is_ascii_graphic());
    (printable && !bytes.is_empty() && bytes.len() <= MAX_CLIENT_ID_BYTES).then(|| value.clone())
}

impl<S, B, RB> Service<Request<B>> for RequestIds<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let headers = request.headers_mut();
        let client = headers.remove(REQUEST_ID).as_ref().and_then(client_id);
        headers.remove(CLIENT_REQUEST_ID);
        let id = HeaderValue::try_from(secure_random::hex_id()).ok();
        if let Some(id) = &id {
            headers.insert(REQUEST_ID, id.clone());
        }
        if let Some(client) = &client {
            headers.insert(CLIENT_REQUEST_ID, client.clone());
        }
        ResponseFuture {
            inner: self.inner.call(request),
            ids: Some((id, client)),
        }
    }
}

pin_project! {
    /// Adds both ids to the response.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        ids: Option<(Option<HeaderValue>, Option<HeaderValue>)>,
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = std::task::ready!(this.inner.poll(cx))?;
        if let Some((id, client)) = this.ids.take() {
            let headers = response.headers_mut();
            if let Some(id) = id {
                headers.insert(REQUEST_ID, id);
            }
            if let Some(client) = client {
                headers.insert(CLIENT_REQUEST_ID, client);
            }
        }
        Poll::Ready(Ok(response))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use tower::ServiceExt;

    #[tokio::test]
    async fn the_clients_id_is_echoed_and_never_passed_on() {
        let seen = tower::service_fn(|r: Request<()>| async move {
            let id = r.headers().get(REQUEST_ID).cloned();
            let client = r.headers().get(CLIENT_REQUEST_ID).cloned();
            Ok::<_, Infallible>(Response::new((id, client)))
        });
        let service = RequestIdLayer.layer(seen);
        let request = Request::builder()
            .header("x-request-id", "victim-id")
            .body(())
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        let (inner_id, inner_client) = response.body().clone();
        let inner_id = inner_id.unwrap();
        assert_ne!(inner_id, "victim-id");
        assert_eq!(inner_id.len(), 32);
        assert_eq!(inner_client.unwrap(), "victim-id");
        assert_eq!(response.headers()[REQUEST_ID], inner_id);
        assert_eq!(response.headers()[CLIENT_REQUEST_ID], "victim-id");

        let long = "x".repeat(200);
        let request = Request::builder()
            .header("x-request-id", long.as_str())
            .body(())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert!(response.body().1.is_none(), "over-long ids are dropped");
    }
}
