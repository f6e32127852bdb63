//! A data thread's stack that follows reloads: it serves each request with the stack built
//! from the generation current when the request arrives.
//!
//! A thread keeps one built stack and the generation number it was built from; a request
//! compares that number with [`Live::number`] (one atomic load) and rebuilds the stack only
//! when a reload moved it. The stack holds its generation's fleet, admission and guard,
//! so in-flight requests and streams finish on the generation they started with.

use http::Request;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tower::Service;

use super::live::Live;
use crate::generation::Generation;

/// One data thread's stack; cheap to clone (one reference count), as hyper does per
/// connection and per request.
pub struct LiveStack<S, F> {
    inner: Arc<Inner<S, F>>,
}

struct Inner<S, F> {
    live: Arc<Live>,
    build: F,
    /// The stack and the generation number it was built from. Only this thread's
    /// connections take the lock, one request at a time: it never waits.
    built: Mutex<(u64, S)>,
}

impl<S, F> LiveStack<S, F>
where
    F: Fn(&Generation) -> S,
{
    /// `build` makes the stack of a generation (with this thread's engine client).
    pub fn new(live: Arc<Live>, build: F) -> Self {
        let generation = live.current();
        let stack = build(&generation);
        Self {
            inner: Arc::new(Inner {
                live,
                build,
                built: Mutex::new((generation.number, stack)),
            }),
        }
    }
}

impl<S, F> Clone for LiveStack<S, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

// === impl LiveStack ===

impl<S, F, B> Service<Request<B>> for LiveStack<S, F>
where
    F: Fn(&Generation) -> S,
    S: Service<Request<B>, Error = Infallible> + Clone,
{
    type Response = S::Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The stack is always ready (see `stack::stage`): capacity is decided per request.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> S::Future {
        let mut stack = {
            let mut built = self.inner.built.lock().unwrap_or_else(|p| p.into_inner());
            if built.0 != self.inner.live.number() {
                let generation = self.inner.live.current();
                *built = (generation.number, (self.inner.build)(&generation));
            }
            built.1.clone()
        };
        stack.call(request)
    }
}
