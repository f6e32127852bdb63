//! The SSE response body: paces token events and knows whether its client stayed.
//!
//! The pace ([`Pace`]) is a wait before each token event: `first` before the first one (the
//! engine's time to first token), `every` before each later one. Each token event that
//! leaves the body is counted (`token_events_sent`), so tests can order what a client saw
//! against what the engine had sent without reading clocks.
//!
//! The body owns the request's place in the running batch (its KV pages and seat), so both
//! are freed exactly when the stream ends or the client goes away (hyper drops the body),
//! which is when a real engine stops generating.

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

use super::config::SimConfig;
use super::prefill::CacheInsert;
use super::reply::Event;
use super::scheduler::Running;
use super::stats::{bump, SimStats};

/// Waits before token events: the time to first token, then the time between tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pace {
    /// Before the first token event.
    pub(crate) first: Duration,
    /// Before each later token event.
    pub(crate) every: Duration,
}

impl Pace {
    /// The pace of `config`: a zero `first_token_latency` means one `token_latency`.
    pub(crate) fn of(config: &SimConfig) -> Self {
        let every = config.token_latency;
        let first = if config.first_token_latency.is_zero() {
            every
        } else {
            config.first_token_latency
        };
        Self { first, every }
    }

    /// The pace of a request whose prompt takes `prefill` to compute: the first token comes
    /// that much later.
    pub(crate) fn after_prefill(self, prefill: Duration) -> Self {
        Self {
            first: self.first.saturating_add(prefill),
            every: self.every,
        }
    }

    /// No wait at all: the whole stream can be written at once.
    pub(crate) fn is_zero(self) -> bool {
        self.first.is_zero() && self.every.is_zero()
    }
}

/// A finite SSE body of prepared events, paced by a [`Pace`] before each token event.
pub(crate) struct SseBody {
    events: VecDeque<Event>,
    pace: Pace,
    /// Token events sent so far by this body.
    tokens_sent: u64,
    sleep: Option<Pin<Box<Sleep>>>,
    slept: bool,
    done: bool,
    pages: Vec<Running>,
    stats: Arc<SimStats>,
    changed: Arc<Notify>,
    /// After the last event, stay silent with the connection open instead of ending.
    stall: bool,
    /// Prompts to cache when their prefill is over: as the first token event leaves (or at
    /// the end, for a stream without one). A client gone before that caches nothing.
    inserts: Vec<CacheInsert>,
}

impl SseBody {
    /// End in silence rather than with the end of the body ([`crate::SimFault::StallStream`]).
    pub(crate) fn stalling(mut self, stall: bool) -> Self {
        self.stall = stall;
        self
    }

    /// Cache these prompts once their prefill is over (see `inserts`).
    pub(crate) fn caching(mut self, inserts: Vec<CacheInsert>) -> Self {
        self.inserts = inserts;
        self
    }

    fn commit_inserts(&mut self) {
        self.inserts.drain(..).for_each(CacheInsert::commit);
    }

    pub(crate) fn new(
        events: impl Into<VecDeque<Event>>,
        pace: Pace,
        pages: Vec<Running>,
        stats: Arc<SimStats>,
        changed: Arc<Notify>,
    ) -> Self {
        bump(&stats.streams_started);
        // Its request was scheduled, looked up and charged: tests may wait for this.
        changed.notify_waiters();
        Self {
            events: events.into(),
            pace,
            tokens_sent: 0,
            sleep: None,
            slept: false,
            done: false,
            pages,
            stats,
            changed,
            stall: false,
            inserts: Vec::new(),
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
                    this.commit_inserts();
                    this.pages.clear();
                    bump(&this.stats.streams_completed);
                    this.changed.notify_waiters();
                }
                return Poll::Ready(None);
            };
            let wait = if this.tokens_sent == 0 {
                this.pace.first
            } else {
                this.pace.every
            };
            if front.token && !this.slept && !wait.is_zero() {
                this.sleep = Some(Box::pin(tokio::time::sleep(wait)));
                continue;
            }
            this.slept = false;
            let token = front.token;
            let data = front.data.clone();
            this.events.pop_front();
            if token {
                if this.tokens_sent == 0 {
                    this.commit_inserts();
                }
                this.tokens_sent += 1;
                bump(&this.stats.token_events_sent);
                this.changed.notify_waiters();
            }
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
            self.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tokio::time::Instant;

    fn event(token: bool, text: &'static str) -> Event {
        Event {
            token,
            data: Bytes::from_static(text.as_bytes()),
        }
    }

    /// Reads every frame, with the (paused, virtual) time since the start at which each came.
    async fn frames(body: SseBody) -> Vec<(Duration, Bytes)> {
        let start = Instant::now();
        let mut body = std::pin::pin!(body);
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            out.push((start.elapsed(), data));
        }
        out
    }

    fn body(pace: Pace, stats: &Arc<SimStats>) -> SseBody {
        let events = vec![
            event(false, "role"),
            event(true, "t1"),
            event(true, "t2"),
            event(true, "t3"),
            event(false, "finish"),
            event(false, "done"),
        ];
        SseBody::new(
            events,
            pace,
            Vec::new(),
            Arc::clone(stats),
            Arc::new(Notify::new()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_token_waits_the_first_token_time_and_later_ones_are_spaced() {
        let stats = Arc::new(SimStats::default());
        let pace = Pace {
            first: Duration::from_millis(40),
            every: Duration::from_millis(20),
        };
        let got = frames(body(pace, &stats)).await;
        let ms = |n| Duration::from_millis(n);
        let want = [
            (ms(0), "role"),
            (ms(40), "t1"),
            (ms(60), "t2"),
            (ms(80), "t3"),
            (ms(80), "finish"),
            (ms(80), "done"),
        ];
        let got: Vec<_> = got
            .iter()
            .map(|(at, data)| (*at, std::str::from_utf8(data).unwrap()))
            .collect();
        assert_eq!(got, want);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.token_events_sent, 3);
        assert_eq!(snapshot.streams_completed, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn pace_of_a_config_defaults_the_first_token_to_one_token_latency() {
        let mut config = SimConfig {
            token_latency: Duration::from_millis(20),
            ..SimConfig::default()
        };
        let pace = Pace::of(&config);
        assert_eq!(pace.first, Duration::from_millis(20));
        config.first_token_latency = Duration::from_millis(300);
        assert_eq!(Pace::of(&config).first, Duration::from_millis(300));
        assert!(Pace::of(&SimConfig::default()).is_zero());
        // The prefill time of a prompt adds to the first token's wait only.
        config.prefill_token_latency = Duration::from_micros(500);
        let paced = Pace::of(&config).after_prefill(config.prefill_time(2000));
        assert_eq!(paced.first, Duration::from_millis(1300));
        assert_eq!(paced.every, Duration::from_millis(20));
        assert_eq!(SimConfig::default().prefill_time(1_000_000), Duration::ZERO);

        // Unpaced, everything leaves at once; each token event is still counted.
        let stats = Arc::new(SimStats::default());
        let got = frames(body(Pace::default(), &stats)).await;
        assert!(got.iter().all(|(at, _)| at.is_zero()));
        assert_eq!(stats.snapshot().token_events_sent, 3);
    }
}
