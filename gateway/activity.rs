//! Recent activity for the admin status page: admitted requests (successes), refusals and
//! errors by code, guard trips by reason and leak suspicions, over the last ten minutes in
//! five-second buckets.
//!
//! The request path only adds: every event is one relaxed `fetch_add` on a running total —
//! no clock read, no lock, no allocation. The buckets are made off the request path: a
//! sampler ([`Activity::sample`], every [`BUCKET`] from the gateway's background loop) copies
//! the totals into a ring of snapshots behind a mutex the request path never takes. A
//! bucket is the difference of two neighbouring snapshots; the bucket still open is the live
//! totals minus the last snapshot, so a page shows an event the moment it is counted.
//!
//! Written by `stack::rescue` (each request's single outcome, I6) and `stack::guard` (stream
//! outcomes, trips, leak suspicions); read by `runtime::status_page`. Unlike the Prometheus
//! counters (process-wide), this belongs to one gateway, so several gateways in one test
//! process do not mix their counts.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The length of one bucket.
pub const BUCKET: Duration = Duration::from_secs(5);

/// Buckets kept: ten minutes of history.
pub const BUCKETS: usize = 120;

/// The error codes counted one by one ([`crate::error::GatewayError::code`]), then the two
/// stream outcomes that are not an error response, then `other` for anything unlisted.
pub const CODES: [&str; 31] = [
    "invalid_request",
    "not_found",
    "method_not_allowed",
    "model_not_found",
    "context_length_exceeded",
    "request_too_large",
    "invalid_api_key",
    "model_not_allowed",
    "unsupported_parameter",
    "lora_not_allowed",
    "pool_choice_not_allowed",
    "priority_not_allowed",
    "unknown_pool",
    "request_timeout",
    "request_header_too_large",
    "overloaded",
    "tokens_exceed_rate_limit",
    "concurrency_limit_exceeded",
    "rate_limit_unavailable",
    "rate_limit_exceeded",
    "no_eligible_worker",
    "upstream_unavailable",
    "upstream_timeout",
    "upstream_status",
    "upstream_protocol_error",
    "upstream_aborted",
    "upstream_integrity_error",
    "internal_error",
    // A stream the guard ended with an error event after its 200 went out.
    "guard_error",
    // A stream the client left before its end.
    "client_cancelled",
    "other",
];

/// The guard's trip reasons ([`crate::stack::guard::inspect::Trip::reason`]), then `other`.
pub const TRIP_REASONS: [&str; 10] = [
    "abort",
    "error_in_success",
    "empty_result",
    "placeholder_marker",
    "prompt_tokens_mismatch",
    "stream_truncated",
    "leak_suspected",
    "unparsable_event",
    "stream_stalled",
    "other",
];

/// The slot of `key` in `names`; unknown keys land in the last slot (`other`). A linear
/// scan over a few dozen short strings: refusals and trips are the rare path.
fn slot(names: &[&str], key: &str) -> usize {
    names
        .iter()
        .position(|n| *n == key)
        .unwrap_or(names.len() - 1)
}

/// An atomic on a cache line of its own: admits are counted by every data thread, and the
/// line they bounce between cores should not also hold the rarer counters.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Padded(AtomicU64);

/// Running totals since the gateway started (the request path's only state).
#[derive(Debug)]
struct Totals {
    admits: Padded,
    refusals: [AtomicU64; CODES.len()],
    trips: [AtomicU64; TRIP_REASONS.len()],
    leaks: AtomicU64,
}

/// Counts of each kind: running totals, one bucket, or a sum over buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests whose single outcome was a success.
    pub admits: u64,
    /// By [`CODES`] slot.
    pub refusals: [u64; CODES.len()],
    /// By [`TRIP_REASONS`] slot.
    pub trips: [u64; TRIP_REASONS.len()],
    pub leaks: u64,
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            admits: 0,
            refusals: [0; CODES.len()],
            trips: [0; TRIP_REASONS.len()],
            leaks: 0,
        }
    }
}

impl Counts {
    /// `self - earlier`, for totals taken in that order.
    fn since(&self, earlier: &Counts) -> Counts {
        let mut d = Counts {
            admits: self.admits.saturating_sub(earlier.admits),
            leaks: self.leaks.saturating_sub(earlier.leaks),
            ..Counts::default()
        };
        for (i, v) in d.refusals.iter_mut().enumerate() {
            *v = self.refusals[i].saturating_sub(earlier.refusals[i]);
        }
        for (i, v) in d.trips.iter_mut().enumerate() {
            *v = self.trips[i].saturating_sub(earlier.trips[i]);
        }
        d
    }

    fn plus(&self, other: &Counts) -> Counts {
        let mut s = *self;
        s.admits += other.admits;
        s.leaks += other.leaks;
        for (i, v) in s.refusals.iter_mut().enumerate() {
            *v += other.refusals[i];
        }
        for (i, v) in s.trips.iter_mut().enumerate() {
            *v += other.trips[i];
        }
        s
    }

    /// Every refusal and error, all codes together.
    pub fn refusal_total(&self) -> u64 {
        self.refusals.iter().sum()
    }

    /// Every guard trip, all reasons together.
    pub fn trip_total(&self) -> u64 {
        self.trips.iter().sum()
    }

    /// The count of refusals with `code`.
    pub fn refusals_of(&self, code: &str) -> u64 {
        self.refusals[slot(&CODES, code)]
    }

    /// The count of guard trips for `reason`.
    pub fn trips_of(&self, reason: &str) -> u64 {
        self.trips[slot(&TRIP_REASONS, reason)]
    }
}

/// Snapshots of the totals, oldest first, one per bucket boundary.
#[derive(Debug)]
struct Ring {
    snapshots: VecDeque<(Instant, Counts)>,
}

/// The recorder of one gateway.
#[derive(Debug)]
pub struct Activity {
    totals: Totals,
    ring: Mutex<Ring>,
}

impl Default for Activity {
    fn default() -> Self {
        Self::new(Instant::now())
    }
}

// === impl Activity ===

impl Activity {
    /// A recorder whose history starts at `now`.
    pub fn new(now: Instant) -> Self {
        let mut snapshots = VecDeque::with_capacity(BUCKETS + 1);
        snapshots.push_back((now, Counts::default()));
        Self {
            totals: Totals {
                admits: Padded::default(),
                refusals: std::array::from_fn(|_| AtomicU64::new(0)),
                trips: std::array::from_fn(|_| AtomicU64::new(0)),
                leaks: AtomicU64::new(0),
            },
            ring: Mutex::new(Ring { snapshots }),
        }
    }

    /// A request ended in success.
    pub fn admit(&self) {
        self.totals.admits.0.fetch_add(1, Ordering::Relaxed);
    }

    /// A request ended in an error with `code` (or a stream in `guard_error` /
    /// `client_cancelled`).
    pub fn refuse(&self, code: &str) {
        self.totals.refusals[slot(&CODES, code)].fetch_add(1, Ordering::Relaxed);
    }

    /// The guard tripped for `reason`.
    pub fn trip(&self, reason: &str) {
        self.totals.trips[slot(&TRIP_REASONS, reason)].fetch_add(1, Ordering::Relaxed);
    }

    /// An answer was suspected of holding another tenant's prompt.
    pub fn leak(&self) {
        self.totals.leaks.fetch_add(1, Ordering::Relaxed);
    }

    /// The totals since start. Each counter is read on its own: a page may see one event
    /// in one counter and not yet in another, never a count that goes down.
    pub fn totals(&self) -> Counts {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            admits: load(&self.totals.admits.0),
            refusals: std::array::from_fn(|i| load(&self.totals.refusals[i])),
            trips: std::array::from_fn(|i| load(&self.totals.trips[i])),
            leaks: load(&self.totals.leaks),
        }
    }

    /// Close the open bucket at `now` (the sampler calls this every [`BUCKET`]); the
    /// oldest bucket falls out once [`BUCKETS`] are kept.
    pub fn sample(&self, now: Instant) {
        let totals = self.totals();
        let mut ring = self.lock();
        ring.snapshots.push_back((now, totals));
        while ring.snapshots.len() > BUCKETS + 1 {
            ring.snapshots.pop_front();
        }
    }

    /// The history as of `now`: closed buckets oldest first, then the open one.
    pub fn recent(&self, now: Instant) -> Recent {
        let totals = self.totals();
        let ring = self.lock();
        let mut buckets: Vec<Counts> = ring
            .snapshots
            .iter()
            .zip(ring.snapshots.iter().skip(1))
            .map(|((_, a), (_, b))| b.since(a))
            .collect();
        let (last_at, last) = ring
            .snapshots
            .back()
            .copied()
            .unwrap_or((now, Counts::default()));
        buckets.push(totals.since(&last));
        let since = ring.snapshots.front().map_or(now, |(at, _)| *at);
        Recent {
            buckets,
            covers: now.saturating_duration_since(since),
            open_for: now.saturating_duration_since(last_at),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // A panic while holding it leaves whole snapshots behind: still usable.
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Recent activity: [`BUCKET`]-long buckets, oldest first; the last one is still open.
#[derive(Debug, Clone)]
pub struct Recent {
    pub buckets: Vec<Counts>,
    /// How long the buckets cover together (less than ten minutes after a start).
    pub covers: Duration,
    /// How long the open bucket has been open.
    pub open_for: Duration,
}

impl Recent {
    /// The sum over every bucket kept.
    pub fn sum(&self) -> Counts {
        self.sum_last(self.buckets.len())
    }

    /// The sum over the last `n` buckets (the open one included).
    pub fn sum_last(&self, n: usize) -> Counts {
        let start = self.buckets.len().saturating_sub(n);
        self.buckets[start..]
            .iter()
            .fold(Counts::default(), |acc, b| b.plus(&acc))
    }

    /// One value per bucket, oldest first (a chart's series).
    pub fn series(&self, value: impl Fn(&Counts) -> u64) -> Vec<u64> {
        self.buckets.iter().map(value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_show_in_the_open_bucket_before_any_sample() {
        let t0 = Instant::now();
        let a = Activity::new(t0);
        a.admit();
        a.admit();
        a.refuse("context_length_exceeded");
        a.refuse("invalid_api_key");
        a.refuse("something new");
        a.trip("prompt_tokens_mismatch");
        a.leak();
        let r = a.recent(t0 + Duration::from_secs(2));
        assert_eq!(r.buckets.len(), 1);
        let s = r.sum();
        assert_eq!(s.admits, 2);
        assert_eq!(s.refusals_of("context_length_exceeded"), 1);
        assert_eq!(s.refusals_of("invalid_api_key"), 1);
        assert_eq!(s.refusals_of("other"), 1, "unknown codes are kept as other");
        assert_eq!(s.refusal_total(), 3);
        assert_eq!(s.trips_of("prompt_tokens_mismatch"), 1);
        assert_eq!(s.trip_total(), 1);
        assert_eq!(s.leaks, 1);
        assert_eq!(r.covers, Duration::from_secs(2));
    }

    #[test]
    fn each_sample_closes_a_bucket_with_what_happened_in_it() {
        let t0 = Instant::now();
        let a = Activity::new(t0);
        a.admit();
        a.sample(t0 + BUCKET);
        a.admit();
        a.admit();
        a.refuse("overloaded");
        a.sample(t0 + BUCKET * 2);
        a.admit();
        let r = a.recent(t0 + BUCKET * 2 + Duration::from_secs(1));
        assert_eq!(r.series(|c| c.admits), vec![1, 2, 1]);
        assert_eq!(r.series(|c| c.refusals_of("overloaded")), vec![0, 1, 0]);
        assert_eq!(
            r.sum_last(2).admits,
            3,
            "the last closed bucket and the open one"
        );
        assert_eq!(r.sum().admits, 4);
        assert_eq!(r.open_for, Duration::from_secs(1));
    }

    #[test]
    fn the_ring_keeps_ten_minutes_and_drops_the_oldest_bucket() {
        let t0 = Instant::now();
        let a = Activity::new(t0);
        // One admit in the first bucket only, then a quiet stretch longer than the ring.
        a.admit();
        for i in 1..=BUCKETS as u32 {
            a.sample(t0 + BUCKET * i);
        }
        let now = t0 + BUCKET * BUCKETS as u32;
        let r = a.recent(now);
        assert_eq!(r.buckets.len(), BUCKETS + 1, "120 closed and the open one");
        assert_eq!(r.sum().admits, 1, "still inside ten minutes");
        assert_eq!(r.covers, BUCKET * BUCKETS as u32);
        // One more sample: the bucket holding the admit falls out.
        a.sample(now + BUCKET);
        let r = a.recent(now + BUCKET);
        assert_eq!(r.buckets.len(), BUCKETS + 1);
        assert_eq!(r.sum().admits, 0);
        assert_eq!(r.covers, BUCKET * BUCKETS as u32);
    }

    #[test]
    fn totals_keep_counting_across_rotations() {
        let t0 = Instant::now();
        let a = Activity::new(t0);
        for i in 1..=(BUCKETS as u32 * 2) {
            a.trip("abort");
            a.sample(t0 + BUCKET * i);
        }
        assert_eq!(a.totals().trips_of("abort"), BUCKETS as u64 * 2);
        let r = a.recent(t0 + BUCKET * (BUCKETS as u32 * 2));
        assert_eq!(r.sum().trips_of("abort"), BUCKETS as u64);
    }

    #[test]
    fn every_trip_reason_and_common_error_code_has_its_own_slot() {
        use crate::error::GatewayError;
        use crate::stack::guard::inspect::Trip;
        let trips = [
            Trip::Aborted {
                status: None,
                message: String::new(),
            },
            Trip::ErrorIn2xx {
                status: None,
                message: String::new(),
            },
            Trip::EmptyResult { detail: "" },
            Trip::PlaceholderMarker,
            Trip::PromptTokens {
                sample: 0,
                expected: 1,
                reported: 2,
            },
            Trip::Truncated { detail: "" },
            Trip::LeakSuspected { owners: 1 },
            Trip::Unparsable { detail: "" },
            Trip::Stalled {
                timeout: Duration::from_secs(1),
            },
        ];
        for trip in &trips {
            let slot = slot(&TRIP_REASONS, trip.reason());
            assert_ne!(
                slot,
                TRIP_REASONS.len() - 1,
                "{} is not listed",
                trip.reason()
            );
            let code = crate::stack::guard::trip_error(trip, "p").code();
            assert_ne!(slot_of_code(code), CODES.len() - 1, "{code} is not listed");
        }
        let errors = [
            GatewayError::Unauthenticated,
            GatewayError::BodyTooLarge { limit: 1 },
            GatewayError::Overloaded {
                ceiling: "in_flight",
            },
            GatewayError::ContextLengthExceeded {
                message: String::new(),
                param: "messages",
            },
            GatewayError::invalid("x", None),
        ];
        for e in &errors {
            assert_ne!(
                slot_of_code(e.code()),
                CODES.len() - 1,
                "{} is not listed",
                e.code()
            );
        }
    }

    fn slot_of_code(code: &str) -> usize {
        slot(&CODES, code)
    }

    #[test]
    fn counting_from_many_threads_loses_nothing() {
        let a = std::sync::Arc::new(Activity::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        a.admit();
                    }
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            a.sample(Instant::now() + BUCKET * (i as u32 + 1));
            t.join().unwrap();
        }
        assert_eq!(a.recent(Instant::now()).sum().admits, 40_000);
    }
}
