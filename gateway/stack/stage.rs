//! One shape for the stack's asynchronous stages (admission, rate limits, the guard).
//!
//! A stage implements [`Stage::handle`]: look at the request, maybe refuse it, call `next`
//! to continue down the stack, and look at (or wrap) what comes back. [`StageLayer`] turns
//! it into a tower layer, so the Layer/Service plumbing — always ready, the inner service
//! cloned per call — is written once here instead of in every stage.
//!
//! [`Next`] is the rest of the stack behind one shared pointer. tower's `BoxCloneService`
//! would clone the whole boxed chain below a stage on every call — one allocation per
//! stage below it, for every stage, on every request — where this clones one reference
//! count and, when called, the concrete service below (reference counts, no allocation).

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service, ServiceExt};

use crate::body::{BoxBody, BoxError};

/// The future a stage returns.
pub type StageFuture = BoxFuture<'static, Result<Response<BoxBody>, BoxError>>;

/// The rest of the stack below a stage; cheap to clone (one reference count).
#[derive(Clone)]
pub struct Next(Arc<dyn CallNext>);

impl Next {
    /// Wrap `service`, the rest of the stack.
    pub fn new<S: Below>(service: S) -> Self {
        Self(Arc::new(service))
    }

    /// Send `request` down the rest of the stack (waiting for it to be ready first, as
    /// tower's `oneshot` does).
    pub fn oneshot(self, request: Request<Bytes>) -> StageFuture {
        self.0.call_next(request)
    }
}

impl std::fmt::Debug for Next {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Next")
    }
}

/// What a stage can call: the rest of the stack, shareable across threads.
pub trait Below:
    Service<Request<Bytes>, Response = Response<BoxBody>, Error = BoxError, Future: Send + 'static>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Below for S
where
    S: Service<Request<Bytes>, Response = Response<BoxBody>, Error = BoxError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
}

/// A service called through a shared reference: a fresh clone serves each request.
trait CallNext: Send + Sync {
    fn call_next(&self, request: Request<Bytes>) -> StageFuture;
}

impl<S: Below> CallNext for S {
    fn call_next(&self, request: Request<Bytes>) -> StageFuture {
        Box::pin(self.clone().oneshot(request))
    }
}

/// An asynchronous stage of the request path.
pub trait Stage: Clone + Send + 'static {
    /// Handle one request; `next` continues down the stack.
    fn handle(&self, request: Request<Bytes>, next: Next) -> StageFuture;
}

/// A [`Stage`] as a tower layer.
#[derive(Debug, Clone)]
pub struct StageLayer<T> {
    stage: T,
}

impl<T> StageLayer<T> {
    /// Wrap `stage`.
    pub fn new(stage: T) -> Self {
        Self { stage }
    }
}

impl<T: Clone, S: Below> Layer<S> for StageLayer<T> {
    type Service = StageService<T>;

    fn layer(&self, inner: S) -> StageService<T> {
        StageService {
            stage: self.stage.clone(),
            next: Next::new(inner),
        }
    }
}

/// The service of a [`StageLayer`].
#[derive(Clone)]
pub struct StageService<T> {
    stage: T,
    next: Next,
}

// === impl StageService ===

impl<T: Stage> Service<Request<Bytes>> for StageService<T> {
    type Response = Response<BoxBody>;
    type Error = BoxError;
    type Future = StageFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Stages and the routing below them are always ready: capacity is decided per
        // request (axum: routing and backpressure don't mix).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        // `Next` clones the service below per call and waits for it to be ready (tower's
        // "be careful when cloning inner services"; all ours are always ready anyway).
        self.stage.handle(request, self.next.clone())
    }
}
