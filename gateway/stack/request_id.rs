//! Request ids: the gateway generates every request's id; the client's never reaches an
//! engine.
//!
//! A client's `x-request-id` is moved to `x-client-request-id` (kept for the logs and
//! echoed back when it is short, printable ASCII; dropped otherwise), and the request gets
//! a fresh 128-bit id from the CSPRNG as its `x-request-id`. Everything below — logs, audit
//! lines, error bodies, the engine's `rid` and `x-request-id` — uses the gateway's id, so
//! no tenant can make an engine confuse its request with another's. The response carries
//! both headers.
//!
//! Writes: the [`RequestId`] extension (stages below read the id from it, never from the
//! header) and the two headers.

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

/// The gateway's id of a request (a request extension): the value of its `x-request-id`.
/// Cheap to clone (the header value's bytes are shared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// A fresh id from the CSPRNG (lowercase hex: always a valid header value and `str`).
    fn generate() -> Option<Self> {
        HeaderValue::try_from(secure_random::hex_id())
            .ok()
            .filter(|v| v.to_str().is_ok())
            .map(Self)
    }

    /// The request's id, if the request id stage gave it one.
    pub fn of<B>(request: &Request<B>) -> Option<&Self> {
        request.extensions().get::<Self>()
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        // Never the fallback: `generate` keeps only values that are text.
        self.0.to_str().unwrap_or_default()
    }

    /// The id as the header value engines and clients get.
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

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

/// The client's id, if it is one worth keeping (short, printable ASCII).
fn client_id(value: &HeaderValue) -> Option<HeaderValue> {
    let bytes = value.as_bytes();
    let printable = bytes.iter().all(|b| b.is_ascii_graphic());
    (printable && !bytes.is_empty() && bytes.len() <= MAX_CLIENT_ID_BYTES).then(|| value.clone())
}

// === impl RequestIds ===

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
        let id = RequestId::generate();
        let headers = request.headers_mut();
        let client = headers.remove(REQUEST_ID).as_ref().and_then(client_id);
        headers.remove(CLIENT_REQUEST_ID);
        if let Some(id) = &id {
            headers.insert(REQUEST_ID, id.0.clone());
        }
        if let Some(client) = &client {
            headers.insert(CLIENT_REQUEST_ID, client.clone());
        }
        let echo = (id.as_ref().map(|id| id.0.clone()), client);
        if let Some(id) = id {
            request.extensions_mut().insert(id);
        }
        ResponseFuture {
            inner: self.inner.call(request),
            echo: Some(echo),
        }
    }
}

pin_project! {
    /// Adds both ids to the response.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        echo: Option<(Option<HeaderValue>, Option<HeaderValue>)>,
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
        let (id, client) = this.echo.take().unwrap_or_default();
        let headers = response.headers_mut();
        if let Some(id) = id {
            headers.insert(REQUEST_ID, id);
        }
        if let Some(client) = client {
            headers.insert(CLIENT_REQUEST_ID, client);
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

    #[tokio::test]
    async fn stages_below_read_the_id_from_the_extension() {
        let seen = tower::service_fn(|r: Request<()>| async move {
            let header = r.headers().get(REQUEST_ID).cloned();
            let id = RequestId::of(&r).map(|id| id.as_str().to_owned());
            Ok::<_, Infallible>(Response::new((header, id)))
        });
        let response = RequestIdLayer
            .layer(seen)
            .oneshot(Request::new(()))
            .await
            .unwrap();
        let (header, id) = response.into_body();
        assert_eq!(header.unwrap(), id.unwrap().as_str());
    }
}
