//! Accept loop shared by the HTTP and bootstrap listeners.

use std::convert::Infallible;
use std::future::Future;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// Response body of every sim endpoint.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Returned by a handler to drop the connection without any response (the `reset` fault).
#[derive(Debug, thiserror::Error)]
#[error("connection reset by the simulated engine")]
pub(crate) struct ResetConnection;

/// A complete JSON response.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(full(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    response
}

/// A body of one chunk.
pub(crate) fn full(data: impl Into<Bytes>) -> Body {
    Full::new(data.into()).boxed_unsync()
}

/// Serves `handler` on `listener` until `shutdown` turns true; then drops every connection.
pub(crate) fn serve<F, Fut>(
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
) -> JoinHandle<()>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Body>, ResetConnection>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = shutdown.wait_for(|stop| *stop) => break,
                // Reap finished connection tasks so the set does not grow without bound.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let Ok((stream, _peer)) = accepted else {
                // Accept errors (e.g. too many open files) are transient; keep serving.
                tokio::task::yield_now().await;
                continue;
            };
            let handler = handler.clone();
            let mut stop = shutdown.clone();
            connections.spawn(async move {
                let service = hyper::service::service_fn(handler);
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = conn => {}
                    _ = stop.wait_for(|stop| *stop) => {}
                }
            });
        }
        connections.shutdown().await;
    })
}
