//! Which pooled connection carried an exchange, and whether it had carried one before.
//!
//! hyper-util's pool retries by itself only the requests it knows it never wrote. An engine
//! that closes a keep-alive connection right after an answer (llama-server does, after every
//! streamed answer) leaves a dead connection in the pool; the next request written on it fails
//! with "connection closed before message completed" or a reset. Telling that stale-connection
//! race apart from an engine that read a request and died needs to know whether the connection
//! had served an earlier exchange, which hyper-util does not expose: every connection this
//! connector makes carries a use counter in its `Connected` extras, read back through
//! `capture_connection`.

use hyper::rt::{Read, ReadBufCursor, Write};
use hyper::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use std::future::Future;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// How many exchanges a connection has been handed; shared by every copy of its `Connected`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Uses(Arc<AtomicU64>);

impl Uses {
    /// Count one more exchange; true when the connection had carried one before.
    pub(crate) fn mark(&self) -> bool {
        self.0.fetch_add(1, Ordering::Relaxed) > 0
    }
}

/// The uses counter of the connection `connected` describes.
pub(crate) fn uses_of(connected: &Connected) -> Option<Uses> {
    let mut extensions = http::Extensions::new();
    connected.get_extras(&mut extensions);
    extensions.get::<Uses>().cloned()
}

/// A connector whose connections carry a [`Uses`] counter.
#[derive(Clone, Debug)]
pub(crate) struct Counting<C>(pub(crate) C);

impl<C> tower::Service<Uri> for Counting<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = Counted<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(Counted {
                io,
                uses: Uses::default(),
            })
        })
    }
}

/// A connection with its use counter.
#[derive(Debug)]
pub(crate) struct Counted<T> {
    io: T,
    uses: Uses,
}

impl<T: Connection> Connection for Counted<T> {
    fn connected(&self) -> Connected {
        self.io.connected().extra(self.uses.clone())
    }
}

impl<T: Read + Unpin> Read for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Counted<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }
}

/// Why a failed exchange may be sent again, on a fresh connection: the connection had served
/// an earlier exchange and closed (or reset) before any byte of this one's answer came back.
pub(crate) fn stale_connection(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() {
                return true;
            }
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            ) {
                return true;
            }
        }
        source = e.source();
    }
    false
}
