//! Body types shared by every stage.
//!
//! [`BoxBody`] is the one response body type of the stack. [`GuardBody`] carries a guard
//! value (a worker's outstanding-request count, later permits and token reservations) for
//! exactly as long as the body lives, so bookkeeping ends when the stream ends or the client
//! goes away, not when the headers leave (the pitfall named in style.md §1.4).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty, Full};
use pin_project_lite::pin_project;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The boxed error every body and combinator in the stack uses.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response body type of the whole stack.
pub type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A complete in-memory body.
pub fn full(bytes: impl Into<Bytes>) -> BoxBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A 200 `application/json` response of `json` (answers kvgate gives itself).
pub fn json_response(json: impl Into<Bytes>) -> http::Response<BoxBody> {
    let mut response = http::Response::new(full(json));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// An empty body.
pub fn empty() -> BoxBody {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Box any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> BoxBody
where
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// How much of an in-memory answer is handed to hyper at a time.
const CHUNK_BYTES: usize = 64 * 1024;

/// An in-memory body handed out in [`CHUNK_BYTES`] slices (no copies). hyper drops a body
/// once it has taken its last frame, so a whole answer in one frame would release what the
/// body guards (slots, loads, the buffer budget's reservation) while the answer still waits
/// in hyper's write queue; in slices, hyper's backpressure keeps the body — and its guards —
/// alive until all but the last slice has been written.
#[derive(Debug, Default)]
pub struct ChunkedBytes {
    rest: Bytes,
}

impl ChunkedBytes {
    /// Serve `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        Self { rest: bytes }
    }
}

impl Body for ChunkedBytes {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(CHUNK_BYTES);
        let chunk = self.rest.split_to(n);
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

pin_project! {
    /// A body that keeps `guard` alive until the inner body has ended or is dropped.
    pub struct GuardBody<B, G> {
        #[pin]
        inner: B,
        guard: Option<G>,
    }
}

impl<B, G> GuardBody<B, G> {
    /// Wrap `inner`, holding `guard` until the end of the body.
    pub fn new(inner: B, guard: G) -> Self {
        Self {
            inner,
            guard: Some(guard),
        }
    }
}

impl<B, G> Body for GuardBody<B, G>
where
    B: Body,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(None) | Poll::Ready(Some(Err(_))) = &polled {
            // The stream is over: release now rather than when hyper drops the body.
            this.guard.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    struct Count(Arc<AtomicUsize>);
    impl Drop for Count {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn guard_is_released_at_end_of_stream() {
        let released = Arc::new(AtomicUsize::new(0));
        let body = GuardBody::new(Full::new(Bytes::from("abc")), Count(released.clone()));
        let mut body = std::pin::pin!(body);
        let first = body.frame().await;
        assert!(first.is_some());
        assert_eq!(released.load(Ordering::SeqCst), 0);
        assert!(body.frame().await.is_none());
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn chunked_bytes_come_in_slices_with_an_exact_size() {
        let data = Bytes::from(vec![7u8; CHUNK_BYTES * 2 + 5]);
        let mut body = ChunkedBytes::new(data.clone());
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let mut sizes = Vec::new();
        let mut all = Vec::new();
        while let Some(frame) = body.frame().await {
            let chunk = frame.unwrap().into_data().unwrap();
            sizes.push(chunk.len());
            all.extend_from_slice(&chunk);
        }
        assert_eq!(sizes, [CHUNK_BYTES, CHUNK_BYTES, 5]);
        assert_eq!(all, data);
        assert!(body.is_end_stream());
    }

    #[test]
    fn guard_is_released_when_body_is_dropped_early() {
        let released = Arc::new(AtomicUsize::new(0));
        let body = GuardBody::new(Full::new(Bytes::from("abc")), Count(released.clone()));
        drop(body);
        assert_eq!(released.load(Ordering::SeqCst), 1);
    }
}
