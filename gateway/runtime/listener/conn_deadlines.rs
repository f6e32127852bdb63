//! Connection-level deadlines the HTTP libraries leave open.
//!
//! - [`SendTimeoutIo`]: a write to the client that makes no progress for `send_timeout`
//!   (the client stopped reading) fails, so hyper closes the connection and drops the
//!   response body — which releases its in-flight slots, worker loads and buffer
//!   reservation. Without it, a stream whose client never reads is never polled again, so
//!   no body-side deadline can fire.
//! - [`until_first_request`]: until a connection's first request arrives, the whole
//!   connection is under `header_read_timeout`. hyper's own header timer starts only once
//!   hyper-util has sniffed HTTP/1 from h2c (a client may send one byte of the preface and
//!   stop), and the HTTP/2 handshake has none.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tower::Service;

/// An IO whose writes time out when they stall.
pub struct SendTimeoutIo<T> {
    inner: T,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> SendTimeoutIo<T> {
    /// Wrap `inner`; a write that stays pending for `timeout` fails.
    pub fn new(inner: T, timeout: Duration) -> Self {
        Self {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// The underlying IO.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    fn check<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client did not read for server.send_timeout",
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeoutIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeoutIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.check(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.check(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Marks its connection as started when the first request reaches the service.
#[derive(Clone)]
pub struct MarkStarted<S> {
    inner: S,
    started: Arc<AtomicBool>,
}

impl<S> MarkStarted<S> {
    /// Wrap `inner`; `started` turns true on the first call.
    pub fn new(inner: S, started: Arc<AtomicBool>) -> Self {
        Self { inner, started }
    }
}

impl<S, R> Service<R> for MarkStarted<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.started.store(true, Ordering::Relaxed);
        self.inner.call(request)
    }
}

/// Run `serving` (one connection); if no request has `started` within `timeout`, drop it
/// (closing the connection) and return `on_timeout()`.
pub async fn until_first_request<F, R>(
    serving: F,
    timeout: Duration,
    started: &AtomicBool,
    on_timeout: impl FnOnce() -> R,
) -> R
where
    F: Future<Output = R>,
{
    tokio::pin!(serving);
    tokio::select! {
        r = &mut serving => r,
        _ = tokio::time::sleep(timeout) => {
            if started.load(Ordering::Relaxed) {
                serving.await
            } else {
                on_timeout()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_never_reads_fails_after_the_timeout() {
        let (near, _far) = tokio::io::duplex(16); // the far end never reads
        let mut io = SendTimeoutIo::new(near, Duration::from_secs(5));
        let err = io.write_all(&[0u8; 64]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_a_request_is_dropped_and_one_with_a_request_is_not() {
        let started = AtomicBool::new(false);
        let idle = until_first_request(
            std::future::pending::<&str>(),
            Duration::from_secs(1),
            &started,
            || "closed",
        );
        assert_eq!(idle.await, "closed");
        started.store(true, Ordering::Relaxed);
        let busy = until_first_request(
            async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "served"
            },
            Duration::from_secs(1),
            &started,
            || "closed",
        );
        assert_eq!(busy.await, "served");
    }
}
