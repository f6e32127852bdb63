//! One shape for the stack's asynchronous stages (admission, rate limits, the guard).
//!
//! A stage implements [`Stage::handle`]: look at the request, maybe refuse it, call `next`
//! to continue down the stack, and look at (or wrap) what comes back. [`StageLayer`] turns
//! it into a tower layer, so the Layer/Service plumbing — always ready, the inner service
//! cloned per call — is written once here instead of in every stage.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use std::task::{Context, Poll};
use tower::util::BoxCloneService;
use tower::{Layer, Service};

use crate::body::{BoxBody, BoxError};

/// The rest of the stack below a stage.
pub type Next = BoxCloneService<Request<Bytes>, Response<BoxBody>, BoxError>;

/// The future a stage returns.
pub type StageFuture = BoxFuture<'static, Result<Response<BoxBody>, BoxError>>;

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

impl<T, S> Layer<S> for StageLayer<T>
where
    T: Clone,
    S: Service<Request<Bytes>, Response = Response<BoxBody>, Error = BoxError>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Service = StageService<T>;

    fn layer(&self, inner: S) -> StageService<T> {
        StageService {
            stage: self.stage.clone(),
            next: BoxCloneService::new(inner),
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
        // A fresh clone per call: the one that was polled ready stays with us (tower's
        // "be careful when cloning inner services"; all ours are always ready anyway).
        self.stage.handle(request, self.next.clone())
    }
}
