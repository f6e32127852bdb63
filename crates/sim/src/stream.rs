//! The SSE response body: paces token events and knows whether its client stayed.
//!
//! The body owns the request's KV pages, so they are freed exactly when the stream ends or
//! the client goes away (hyper drops the body), which is when a real engine stops generating.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame};
use tokio::sync::Notify;
use tokio::time::Sleep;

use super::kv_pool::Allocation;
use super::reply::Event;
use super::stats::{bump, SimStats};

/// A finite SSE body of prepared events, one `token_latency` before each token event.
pub(crate) struct SseBody {
    events: VecDeque<Event>,
    latency: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    slept: bool,
    done: bool,
    pages: Vec<Allocation>,
    stats: Arc<SimStats>,
    changed: Arc<Notify>,
    /// After the last event, stay silent with the connection open instead of ending.
    stall: bool,
}

impl SseBody {
    /// End in silence rather than with the end of the body ([`crate::SimFault::StallStream`]).
    pub(crate) fn stalling(mut self, stall: bool) -> Self {
        self.stall = stall;
        self
    }

    pub(crate) fn new(
        events: Vec<Event>,
        latency: Duration,
        pages: Vec<Allocation>,
        stats: Arc<SimStats>,
        changed: Arc<Notify>,
    ) -> Self {
        bump(&stats.streams_started);
        bump(&stats.running);
        Self {
            events: events.into(),
            latency,
            sleep: None,
            slept: false,
            done: false,
            pages,
            stats,
            changed,
            stall: false,
        }
    }
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        loop {
            if let Some(sleep) = this.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.sleep = None;
                this.slept = true;
            }
            let Some(front) = this.events.front() else {
                if this.stall {
                    // Never woken: the stream is silent until the client gives up.
                    return Poll::Pending;
                }
                if !this.done {
                    this.done = true;
                    this.pages.clear();
                    bump(&this.stats.streams_completed);
                    this.stats
                        .running
                        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                    this.changed.notify_waiters();
                }
                return Poll::Ready(None);
            };
            if front.token && !this.slept && !this.latency.is_zero() {
                this.sleep = Some(Box::pin(tokio::time::sleep(this.latency)));
                continue;
            }
            this.slept = false;
            let data = front.data.clone();
            this.events.pop_front();
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        if !self.done {
            // Dropped before its end: hyper gave up on the client (disconnect).
            self.pages.clear();
            bump(&self.stats.streams_cancelled);
            self.stats
                .running
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.changed.notify_waiters();
        }
    }
}
