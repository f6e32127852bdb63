//! One Layer/Service pair for the stages that see the request before its body is read
//! (trace context, rescue, load shedding, the catalog), so each is generic over the request
//! body `B` in one place instead of in four hand-written pairs.
//!
//! A stage is a plain `Clone` value (its configuration, shared state) that implements
//! [`Wrap`]: what to do with one request, given the service below. [`ShellLayer`] clones it
//! into a [`Shell`] around each inner service. Most stages box their future and answer
//! `Response<BoxBody>`; they implement [`BoxedWrap`], which names only the error. The
//! stages below `read_body` see `Request<Bytes>` and use [`super::stage`] instead.

use futures_util::future::BoxFuture;
use http::{Request, Response};
use std::future::Future;
use std::task::{Context, Poll};
use tower::{Layer, Service};

use crate::body::{BoxBody, BoxError};

/// A stage's own logic around `S`, the service below it.
pub trait Wrap<S, B> {
    /// What the stage answers.
    type Response;
    /// Its error (`Infallible` for rescue, at the top of the stack).
    type Error;
    /// Its future.
    type Future: Future<Output = Result<Self::Response, Self::Error>>;

    /// Whether the stage can take a request. By default always: the stages below are
    /// always ready, and a stage that clones `inner` per call waits for the clone in
    /// `oneshot`. A stage that calls `inner` directly delegates here.
    fn poll_ready(&self, inner: &mut S, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        let _ = (inner, cx);
        Poll::Ready(Ok(()))
    }

    /// Handle one request; `inner` is the rest of the stack.
    fn call(&self, inner: &mut S, request: Request<B>) -> Self::Future;
}

/// The service below a stage that boxes its future (catalog, load shedding, rescue): it
/// answers `Response<BoxBody>` or a `BoxError`, and is cloned into each request's future.
pub trait Inner<B>:
    Service<Request<B>, Response = Response<BoxBody>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + 'static
{
}

impl<S, B> Inner<B> for S
where
    S: Service<Request<B>, Response = Response<BoxBody>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
{
}

/// The future of a [`BoxedWrap`] stage.
pub type ShellFuture<E = BoxError> = BoxFuture<'static, Result<Response<BoxBody>, E>>;

/// A stage that boxes its future, above an [`Inner`] service.
pub trait BoxedWrap {
    /// Its error (`Infallible` for rescue, at the top of the stack).
    type Error;

    /// Handle one request; `inner` is the rest of the stack (clone it into the future).
    fn call<S: Inner<B>, B: Send + 'static>(
        &self,
        inner: &S,
        request: Request<B>,
    ) -> ShellFuture<Self::Error>;
}

impl<T, S, B> Wrap<S, B> for T
where
    T: BoxedWrap,
    S: Inner<B>,
    B: Send + 'static,
{
    type Response = Response<BoxBody>;
    type Error = T::Error;
    type Future = ShellFuture<T::Error>;

    // `poll_ready`: the default, always ready (the future readies its clone of `inner`).

    fn call(&self, inner: &mut S, request: Request<B>) -> Self::Future {
        BoxedWrap::call(self, inner, request)
    }
}

/// A [`Wrap`] stage as a tower layer.
#[derive(Debug, Clone)]
pub struct ShellLayer<T> {
    stage: T,
}

impl<T> ShellLayer<T> {
    /// Wrap each inner service in `stage`.
    pub fn new(stage: T) -> Self {
        Self { stage }
    }
}

impl<T: Clone, S> Layer<S> for ShellLayer<T> {
    type Service = Shell<T, S>;

    fn layer(&self, inner: S) -> Shell<T, S> {
        Shell {
            stage: self.stage.clone(),
            inner,
        }
    }
}

/// The service of a [`ShellLayer`]: the stage and the service below it.
#[derive(Debug, Clone)]
pub struct Shell<T, S> {
    stage: T,
    inner: S,
}

// === impl Shell ===

impl<T, S, B> Service<Request<B>> for Shell<T, S>
where
    T: Wrap<S, B>,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = T::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), T::Error>> {
        self.stage.poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: Request<B>) -> T::Future {
        self.stage.call(&mut self.inner, request)
    }
}
