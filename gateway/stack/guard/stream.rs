//! The stream path: a guarded SSE body re-frames the engine's stream, checks every event,
//! and ends it with an error event (never `[DONE]`) when a check trips. The status line is
//! held until the first event has been checked ([`guard_stream`]). Dropping the body
//! (client gone) drops the upstream body, which cancels the engine's work.

use bytes::Bytes;
use http::response::Parts;
use http::Response;
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::check_stream::StreamCheck;
use super::extensions::OutcomeAtStreamEnd;
use super::inspect::{Expectation, Trip};
use super::leak::LeakScan;
use super::plan::GuardPlan;
use super::report::TripReport;
use super::sse::{SseEvent, SseReframer};
use crate::body::{self, BoxBody, BoxError};
use crate::error::GatewayError;
use crate::stack::rate_limit::UsageCell;

/// Guard the streamed answer (`parts` and `body`): the response with the guarded body once
/// its first event has passed, or the trip's error (a proper status instead of a 200).
pub(super) async fn guard_stream(
    mut parts: Parts,
    body: BoxBody,
    plan: &GuardPlan<'_>,
    expect: Expectation,
    leak: Option<LeakScan>,
    report: TripReport,
) -> Result<Response<BoxBody>, GatewayError> {
    let markers = plan.rules.markers.clone();
    let mut check = StreamCheck::new(plan.shape, markers, expect, plan.batch, plan.rewrite)
        .with_leak_scan(leak);
    if !plan.checks {
        check = check.without_checks();
    }
    let mut guarded =
        GuardedStream::new(body, check, report.clone()).with_usage(plan.usage.clone());
    if let Err(trip) = guarded.prime(plan.rules.config.first_event_timeout).await {
        return Err(report.record(&trip));
    }
    parts.extensions.insert(OutcomeAtStreamEnd);
    Ok(Response::from_parts(parts, guarded.into_body()))
}

/// How a guarded stream ended, for the outcome count (I6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Completed,
    Tripped,
}

/// The guarded stream.
pub struct GuardedStream {
    inner: Option<BoxBody>,
    reframer: SseReframer,
    check: StreamCheck,
    out: VecDeque<Bytes>,
    phase: Phase,
    primed: bool,
    /// Handed to the client: only then does its end count as the request's outcome.
    delivered: bool,
    report: TripReport,
    /// Events read from the engine, not checked yet: checked one at a time, so the first
    /// goes out before the rest of a large chunk is looked at.
    pending: VecDeque<SseEvent>,
    /// Bytes read from the engine, not re-framed yet: a large chunk (an engine that had a
    /// burst ready, a fast one) is re-framed [`REFRAME_SLICE`] bytes at a time, so the first
    /// events are checked and sent before the rest of the chunk is even cut into events.
    unframed: Bytes,
    /// The engine's body ended (its tail is in `pending`).
    upstream_ended: bool,
    usage: Option<UsageCell>,
    /// When the first and the latest frames went to hyper (time to first token, the mean
    /// time between tokens).
    first_out: Option<Instant>,
    last_out: Option<Instant>,
}

/// Bytes of a chunk re-framed at once: a dozen typical events, enough for strict mode's
/// hold-back to release the first.
const REFRAME_SLICE: usize = 4096;

impl GuardedStream {
    /// Guard `inner` with `check`; trips are reported through `report`.
    pub fn new(inner: BoxBody, check: StreamCheck, report: TripReport) -> Self {
        Self {
            inner: Some(inner),
            reframer: SseReframer::new(),
            check,
            out: VecDeque::new(),
            phase: Phase::Open,
            primed: false,
            delivered: false,
            report,
            pending: VecDeque::new(),
            unframed: Bytes::new(),
            upstream_ended: false,
            usage: None,
            first_out: None,
            last_out: None,
        }
    }

    /// Report the engine's usage here when the stream completes (rate-limit settlement).
    pub fn with_usage(mut self, usage: Option<UsageCell>) -> Self {
        self.usage = usage;
        self
    }

    /// Read until the first data event has been checked (or the stream ended), within
    /// `timeout`. A trip here is returned, so the client gets a proper status and JSON error
    /// instead of a 200 (the status line is held until this returns).
    pub async fn prime(&mut self, timeout: Duration) -> Result<(), Trip> {
        let first = async {
            while self.phase == Phase::Open && self.check.data_events() == 0 {
                self.step().await?;
            }
            Ok(())
        };
        let result = match tokio::time::timeout(timeout, first).await {
            Ok(r) => r,
            Err(_) => Err(Trip::Truncated {
                detail: "no first event from the engine within the guard's first_event_timeout",
            }),
        };
        self.primed = true;
        if result.is_err() {
            self.inner = None;
            self.phase = Phase::Tripped;
        }
        result
    }

    /// Check the next event the engine sent, reading a frame when none is waiting; once
    /// the engine's body ended and every event passed, run the end-of-stream checks.
    async fn step(&mut self) -> Result<(), Trip> {
        if let Some(result) = self.step_buffered() {
            return result;
        }
        let Some(inner) = self.inner.as_mut() else {
            return Ok(());
        };
        match inner.frame().await {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    return Ok(()); // trailers: nothing to check
                };
                self.unframed = data;
                self.reframe_slice()
            }
            Some(Err(e)) => match crate::error::GatewayError::from_boxed(e) {
                // Dispatch's deadlines end a silent or over-long stream with this error.
                crate::error::GatewayError::UpstreamTimeout { timeout, .. } => {
                    self.trip(Trip::Stalled { timeout })
                }
                _ => self.trip(Trip::Truncated {
                    detail: "the engine's stream broke off",
                }),
            },
            None => {
                // Only read once every byte before is re-framed: the tail is the last event.
                self.inner = None;
                self.upstream_ended = true;
                self.pending.extend(self.reframer.finish());
                Ok(())
            }
        }
    }

    /// A step over what was already read from the engine, without waiting for more: `None`
    /// when the next step needs a read.
    fn step_buffered(&mut self) -> Option<Result<(), Trip>> {
        if let Some(event) = self.pending.pop_front() {
            return Some(self.check_one(&event));
        }
        if !self.unframed.is_empty() {
            return Some(self.reframe_slice());
        }
        if self.upstream_ended {
            return Some(self.finish());
        }
        None
    }

    /// Re-frame the next slice of what the engine sent.
    fn reframe_slice(&mut self) -> Result<(), Trip> {
        let slice = self
            .unframed
            .split_to(self.unframed.len().min(REFRAME_SLICE));
        if self.reframer.push(&slice, &mut self.pending).is_err() {
            return self.trip(Trip::Truncated {
                detail: "an SSE event from the engine exceeded the size limit",
            });
        }
        Ok(())
    }

    fn check_one(&mut self, event: &SseEvent) -> Result<(), Trip> {
        match self.check.event(event) {
            Ok(Some(bytes)) => {
                let ready = self.check.release(bytes);
                self.out.extend(ready);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(trip) => self.trip(trip),
        }
    }

    /// The engine's stream ended and every event passed: the end-of-stream checks.
    fn finish(&mut self) -> Result<(), Trip> {
        match self.check.end() {
            Ok(()) => {
                let rest = self.check.release_all();
                self.out.extend(rest);
                if let (Some(cell), Some(total)) = (&self.usage, self.check.usage_total()) {
                    cell.set(total);
                }
                if let Some(used) = self.check.token_usage() {
                    self.report.usage(used);
                }
                self.phase = Phase::Completed;
                Ok(())
            }
            Err(trip) => self.trip(trip),
        }
    }

    /// Before priming a trip is returned (becomes an HTTP error); after, it becomes an SSE
    /// error event that ends the stream, and nothing the engine sends later is forwarded.
    fn trip(&mut self, trip: Trip) -> Result<(), Trip> {
        self.inner = None;
        self.pending.clear();
        self.phase = Phase::Tripped;
        if !self.primed {
            return Err(trip);
        }
        let error = self.report.record(&trip);
        self.out.push_back(SseEvent::data_event(
            &error.to_json(self.report.request_id()).to_string(),
        ));
        Ok(())
    }

    /// The client-facing body.
    pub fn into_body(mut self) -> BoxBody {
        self.delivered = true;
        // `frames`: frames handed to hyper so far.
        let stream = futures_util::stream::unfold((self, 0usize), |(mut s, frames)| async move {
            let first = frames == 0;
            if frames == 1 {
                // The first event is with hyper: let it write the head and that event now
                // (it writes when the body is not ready) rather than after a whole burst —
                // in strict mode too, where it goes out only once later events were checked.
                tokio::task::yield_now().await;
            }
            loop {
                if let Some(bytes) = s.out.pop_front() {
                    let bytes = if first { bytes } else { s.coalesce(bytes) };
                    // One clock read per frame, not per token: frames carry bursts.
                    let now = Instant::now();
                    if s.first_out.is_none() {
                        s.first_out = Some(now);
                    }
                    s.last_out = Some(now);
                    return Some((
                        Ok::<_, BoxError>(http_body::Frame::data(bytes)),
                        (s, frames + 1),
                    ));
                }
                if s.phase != Phase::Open {
                    return None;
                }
                // Trips after priming are turned into error events inside `trip`.
                let _ = s.step().await;
            }
        });
        body::boxed(http_body_util::StreamBody::new(stream))
    }
}

impl GuardedStream {
    /// `first` and whatever else is ready to go out, checking the events already read
    /// (no waiting), up to [`COALESCE_BYTES`]: one write for a burst the engine sent at
    /// once, instead of a write (and a syscall) per event.
    fn coalesce(&mut self, first: Bytes) -> Bytes {
        if self.out.is_empty() && self.pending.is_empty() && self.unframed.is_empty() {
            return first;
        }
        let mut frame = bytes::BytesMut::with_capacity(COALESCE_BYTES.max(first.len()));
        frame.extend_from_slice(&first);
        while frame.len() < COALESCE_BYTES {
            if let Some(bytes) = self.out.pop_front() {
                frame.extend_from_slice(&bytes);
                continue;
            }
            if self.phase != Phase::Open {
                break;
            }
            // Trips become error events in `out` (see `trip`); the loop sends them.
            if self.step_buffered().is_none() {
                break;
            }
        }
        frame.freeze()
    }
}

/// Most bytes coalesced into one frame for the client.
const COALESCE_BYTES: usize = 16 * 1024;

impl Drop for GuardedStream {
    fn drop(&mut self) {
        if !self.delivered {
            return; // a trip before delivery is the error response's outcome
        }
        let outcome = match self.phase {
            Phase::Completed => "success",
            Phase::Tripped => "guard_error",
            Phase::Open => "client_cancelled",
        };
        if let (Some(first), Some(last)) = (self.first_out, self.last_out) {
            self.report.token_times(first, last);
        }
        self.report.outcome(outcome);
    }
}

impl std::fmt::Debug for GuardedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedStream")
            .field("phase", &self.phase)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::guard::check_stream::UsageRewrite;
    use crate::stack::guard::inspect::{Expectation, Markers, Shape};

    fn chunk(content: &str) -> String {
        format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\"finish_reason\":null}}]}}\n\n")
    }

    /// One frame holding a burst of events, then an engine that stays silent.
    fn burst_then_silence() -> BoxBody {
        let burst = format!("{}{}{}", chunk("a"), chunk("b"), chunk("c"));
        use futures_util::StreamExt;
        let frames = futures_util::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
            Bytes::from(burst),
        ))])
        .chain(futures_util::stream::pending());
        body::boxed(http_body_util::StreamBody::new(frames))
    }

    fn guarded(inner: BoxBody) -> GuardedStream {
        guarded_with(inner, None)
    }

    fn guarded_with(
        inner: BoxBody,
        leak: Option<crate::stack::guard::leak::LeakScan>,
    ) -> GuardedStream {
        let check = StreamCheck::new(
            Shape::OpenAi,
            Markers::default(),
            Expectation {
                prompt_tokens: None,
                tolerance: 0,
            },
            1,
            UsageRewrite::default(),
        )
        .with_leak_scan(leak);
        let audit = crate::audit::AuditLog::open(&crate::config::AuditConfig {
            sink: crate::config::AuditSink::None,
            ..Default::default()
        })
        .unwrap();
        let sinks = super::super::report::Sinks::new(audit, Default::default());
        let report = TripReport::new(
            std::sync::Arc::new(sinks),
            "p".into(),
            Default::default(),
            None,
        );
        GuardedStream::new(inner, check, report)
    }

    #[tokio::test]
    async fn in_strict_mode_the_first_released_event_is_written_before_the_rest_is_checked() {
        // Strict mode releases the first event only once 10 later units were scanned; then
        // the body must still step back once (so hyper writes the head and that event)
        // before checking and coalescing the rest of what was read.
        let store = crate::stack::isolate::FingerprintStore::new(Default::default());
        let scan = crate::stack::guard::leak::LeakScan::new(
            store.scanner("tenant"),
            crate::config::LeakMode::Strict,
            std::sync::Arc::new(|_| {}),
        );
        let burst: String = (0..30).map(|i| chunk(&format!(" w{i}"))).collect();
        use futures_util::StreamExt;
        let frames = futures_util::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
            Bytes::from(burst.clone()),
        ))])
        .chain(futures_util::stream::pending());
        let mut stream = guarded_with(
            body::boxed(http_body_util::StreamBody::new(frames)),
            Some(scan),
        );
        stream.prime(Duration::from_secs(5)).await.unwrap();
        let mut client = stream.into_body();
        let first = client.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, Bytes::from(chunk(" w0")));
        let mut next = std::pin::pin!(client.frame());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            std::future::Future::poll(next.as_mut(), &mut cx).is_pending(),
            "the body steps back once after the first frame"
        );
        let rest = next.await.unwrap().unwrap().into_data().unwrap();
        assert!(rest.starts_with(chunk(" w1").as_bytes()) && rest.len() > chunk(" w1").len());
    }

    #[tokio::test]
    async fn a_large_burst_is_cut_into_events_a_slice_at_a_time() {
        // 300 events in one frame (an engine that had them all ready), the last one
        // finishing, then [DONE]; the slices cut events anywhere.
        let mut burst: String = (0..300).map(|i| chunk(&format!("w{i}"))).collect();
        burst.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        assert!(burst.len() > 4 * REFRAME_SLICE);
        let frames = futures_util::stream::iter([Ok::<_, BoxError>(http_body::Frame::data(
            Bytes::from(burst.clone()),
        ))]);
        let mut stream = guarded(body::boxed(http_body_util::StreamBody::new(frames)));
        stream.prime(Duration::from_secs(5)).await.unwrap();
        assert!(
            stream.unframed.len() > burst.len() - 2 * REFRAME_SLICE,
            "priming re-framed only the first slice, {} bytes left",
            stream.unframed.len()
        );
        // Everything arrives, in order, byte for byte.
        let client = stream.into_body();
        let got = client.collect().await.unwrap().to_bytes();
        assert_eq!(got, Bytes::from(burst));
    }

    #[tokio::test]
    async fn the_first_event_of_a_burst_goes_out_before_the_rest_is_checked() {
        let mut stream = guarded(burst_then_silence());
        stream.prime(Duration::from_secs(5)).await.unwrap();
        assert_eq!(
            stream.check.data_events(),
            1,
            "priming checks one event, not the burst"
        );
        let mut client = stream.into_body();
        let first = client.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, Bytes::from(chunk("a")));
        // The rest of the burst follows, checked one by one and sent in one write; then the
        // silence holds.
        let rest = client.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(rest, Bytes::from(chunk("b") + &chunk("c")));
        let more = tokio::time::timeout(Duration::from_millis(50), client.frame()).await;
        assert!(more.is_err(), "nothing more until the engine speaks");
    }
}
