//! Trace context: decides whether a request has a trace (the client's `traceparent`, or a
//! sampled new one when export is on), puts it in the request's extensions for the stages
//! and dispatch, and records the server span: its parent is the client's span, it ends
//! when the response body ends (streams included), and it carries the request id, the
//! status, the error code and what the stages learnt (tenant, model, pool, workers,
//! prompt tokens).
//!
//! Sits right below `request_id` (the span names the gateway's id). A request without a
//! trace costs one header lookup here and nothing below.
//!
//! Writes: `Arc<RequestTrace>`. Reads: the response extension [`ErrorCode`] set by rescue.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

use crate::stack::request_id::RequestId;
use crate::stack::shell::{ShellLayer, Wrap};
use crate::telemetry::{AttrValue, RequestTrace, Span, Telemetry};

/// The error code of a refused or failed request (a response extension, set by rescue
/// only for traced requests).
#[derive(Debug, Clone, Copy)]
pub struct ErrorCode(pub &'static str);

/// Starts a request's trace and its server span.
#[derive(Debug, Clone)]
pub struct TraceContext {
    telemetry: Telemetry,
}

impl TraceContext {
    /// Trace requests as `telemetry` says.
    pub fn layer(telemetry: Telemetry) -> ShellLayer<Self> {
        ShellLayer::new(Self { telemetry })
    }
}

// === impl TraceContext ===

impl<S, B, RB> Wrap<S, B> for TraceContext
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<TracedBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&self, inner: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        inner.poll_ready(cx)
    }

    fn call(&self, inner: &mut S, mut request: Request<B>) -> Self::Future {
        let request_id = RequestId::of(&request).map(RequestId::header_value);
        let Some(trace) = self.telemetry.trace_for(request.headers(), request_id) else {
            return ResponseFuture {
                inner: inner.call(request),
                traced: None,
            };
        };
        let span = trace.recording().then(|| {
            let mut span = trace.server_span("request");
            span.attr(
                "http.request.method",
                AttrValue::Str(request.method().as_str().to_owned()),
            );
            span.attr("url.path", AttrValue::Str(request.uri().path().to_owned()));
            if let Some(id) = trace.request_id.as_ref().and_then(|v| v.to_str().ok()) {
                span.attr("kvgate.request_id", AttrValue::Str(id.to_owned()));
            }
            span
        });
        request.extensions_mut().insert(trace.clone());
        ResponseFuture {
            inner: inner.call(request),
            traced: span.map(|span| (trace, span)),
        }
    }
}

pin_project! {
    /// Completes the server span with the response and hands it to the body.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        traced: Option<(Arc<RequestTrace>, Span)>,
    }
}

impl<F, RB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<TracedBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let span = this.traced.take().map(|(trace, mut span)| {
            let status = response.status();
            span.attr(
                "http.response.status_code",
                AttrValue::Int(i64::from(status.as_u16())),
            );
            if let Some(ErrorCode(code)) = response.extensions().get::<ErrorCode>() {
                span.attr("error.type", AttrValue::Static(code));
            }
            // Server spans fail on 5xx only (a 4xx is the client's error, OTel semantics).
            if status.is_server_error() {
                let code = response.extensions().get::<ErrorCode>().map(|c| c.0);
                span.fail(code.unwrap_or(status.as_str()));
            }
            span.attrs(trace.take_server_attrs());
            span
        });
        Poll::Ready(Ok(response.map(|inner| TracedBody { inner, span })))
    }
}

pin_project! {
    /// The response body; the server span ends when it is dropped (read to its end, or the
    /// client went away), so a stream's span covers the whole stream.
    pub struct TracedBody<B> {
        #[pin]
        inner: B,
        span: Option<Span>,
    }
}

impl<B> Body for TracedBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Err(_)) => {
                if let Some(span) = this.span.as_mut() {
                    span.fail("the response body failed");
                }
            }
            None => {
                if let Some(span) = this.span.take() {
                    span.end();
                }
            }
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
