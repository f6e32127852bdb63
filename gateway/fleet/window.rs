//! A pool's recent health: what its requests came to over a sliding window.
//!
//! The window is ten buckets of a tenth of its length each; a bucket older than the window
//! is reset when its slot comes round again, so memory is fixed (≈ 5 KiB a pool) and the
//! window slides in steps of a tenth. One short mutex per finished request: recording is a
//! few additions, never an allocation once a bucket has seen its trip reasons.

use std::sync::Mutex;
use std::time::{Duration, Instant};

const BUCKETS: usize = 10;
/// Time-to-first-byte histogram: four bins per doubling from 1 µs (≈ 19 % wide), up to
/// 2^32 µs (≈ 71 min); p99 is read as the upper edge of its bin.
const TTFT_BINS: usize = 128;

/// What one finished request contributes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Outcome {
    /// The first guard trip's reason, whether the client got an error or (detect mode,
    /// guard checks off) the answer.
    pub trip: Option<&'static str>,
    /// The engine failed: a 5xx, unreachable, timed out or unreadable.
    pub engine_error: bool,
    /// The leak detector suspected another tenant's data in the answer.
    pub leak: bool,
    /// Time to the first byte of the answer (the first checked event of a stream).
    pub ttft: Option<Duration>,
}

#[derive(Debug, Clone)]
struct Bucket {
    /// Which tenth of time this bucket holds (`elapsed / bucket_len`).
    epoch: u64,
    requests: u64,
    engine_errors: u64,
    leaks: u64,
    trips: Vec<(&'static str, u64)>,
    ttft: [u32; TTFT_BINS],
}

impl Bucket {
    fn empty(epoch: u64) -> Self {
        Self {
            epoch,
            requests: 0,
            engine_errors: 0,
            leaks: 0,
            trips: Vec::new(),
            ttft: [0; TTFT_BINS],
        }
    }
}

/// The sliding window of one pool.
#[derive(Debug)]
pub struct SignalWindow {
    origin: Instant,
    bucket_len: Duration,
    buckets: Mutex<Vec<Bucket>>,
}

/// The window summed up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    pub requests: u64,
    pub engine_errors: u64,
    pub leaks: u64,
    /// Trips per reason, most frequent first.
    pub trips: Vec<(&'static str, u64)>,
    /// Requests that reported a time to first byte.
    pub ttft_samples: u64,
    pub ttft_p99: Option<Duration>,
}

impl Rates {
    /// `count` as a share of requests (0 when there were none).
    pub fn share(&self, count: u64) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            count as f64 / self.requests as f64
        }
    }

    /// All guard trips.
    pub fn trip_total(&self) -> u64 {
        self.trips.iter().map(|(_, n)| n).sum()
    }

    /// Trips of one reason.
    pub fn trips_of(&self, reason: &str) -> u64 {
        self.trips
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }
}

fn ttft_bin(d: Duration) -> usize {
    let micros = d.as_micros().max(1) as f64;
    ((micros.log2() * 4.0) as usize).min(TTFT_BINS - 1)
}

fn ttft_upper_edge(bin: usize) -> Duration {
    Duration::from_micros(2f64.powf((bin + 1) as f64 / 4.0).ceil() as u64)
}

impl SignalWindow {
    /// A window of `length` (at least ten milliseconds).
    pub fn new(length: Duration) -> Self {
        let bucket_len = (length / BUCKETS as u32).max(Duration::from_millis(1));
        Self {
            origin: Instant::now(),
            bucket_len,
            buckets: Mutex::new(vec![Bucket::empty(u64::MAX); BUCKETS]),
        }
    }

    /// The window's length.
    pub fn length(&self) -> Duration {
        self.bucket_len * BUCKETS as u32
    }

    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        (elapsed.as_nanos() / self.bucket_len.as_nanos().max(1)) as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Bucket>> {
        // A panic while holding the lock leaves counters, not invariants: keep using them.
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count one finished request at `now`.
    pub fn record(&self, outcome: &Outcome, now: Instant) {
        let epoch = self.epoch(now);
        let mut buckets = self.lock();
        let bucket = &mut buckets[(epoch % BUCKETS as u64) as usize];
        if bucket.epoch != epoch {
            *bucket = Bucket::empty(epoch);
        }
        bucket.requests += 1;
        bucket.engine_errors += u64::from(outcome.engine_error);
        bucket.leaks += u64::from(outcome.leak);
        if let Some(reason) = outcome.trip {
            match bucket.trips.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => bucket.trips.push((reason, 1)),
            }
        }
        if let Some(t) = outcome.ttft {
            bucket.ttft[ttft_bin(t)] += 1;
        }
    }

    /// The rates over the window ending at `now`.
    pub fn rates(&self, now: Instant) -> Rates {
        let current = self.epoch(now);
        let oldest = current.saturating_sub(BUCKETS as u64 - 1);
        let buckets = self.lock();
        let mut rates = Rates::default();
        let mut ttft = [0u64; TTFT_BINS];
        for b in buckets
            .iter()
            .filter(|b| b.epoch != u64::MAX && (oldest..=current).contains(&b.epoch))
        {
            rates.requests += b.requests;
            rates.engine_errors += b.engine_errors;
            rates.leaks += b.leaks;
            for &(reason, n) in &b.trips {
                match rates.trips.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, m)) => *m += n,
                    None => rates.trips.push((reason, n)),
                }
            }
            for (sum, &n) in ttft.iter_mut().zip(b.ttft.iter()) {
                *sum += u64::from(n);
            }
        }
        drop(buckets);
        rates.trips.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        rates.ttft_samples = ttft.iter().sum();
        if rates.ttft_samples > 0 {
            // The smallest bin edge with at least 99 % of samples at or below it.
            let rank = (rates.ttft_samples * 99).div_ceil(100);
            let mut seen = 0;
            rates.ttft_p99 = ttft.iter().enumerate().find_map(|(bin, &n)| {
                seen += n;
                (seen >= rank).then(|| ttft_upper_edge(bin))
            });
        }
        rates
    }

    /// Forget everything (a rollback was cleared: the old canary's record must not
    /// decide about the fixed one).
    pub fn reset(&self) {
        let mut buckets = self.lock();
        for b in buckets.iter_mut() {
            *b = Bucket::empty(u64::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(ms: u64) -> Outcome {
        Outcome {
            ttft: Some(Duration::from_millis(ms)),
            ..Outcome::default()
        }
    }

    #[test]
    fn counts_and_trip_reasons_add_up_over_the_window() {
        let w = SignalWindow::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for _ in 0..8 {
            w.record(&ok(5), t0);
        }
        let trip = Outcome {
            trip: Some("prompt_tokens_mismatch"),
            ..Outcome::default()
        };
        w.record(&trip, t0 + Duration::from_secs(3));
        w.record(
            &Outcome {
                engine_error: true,
                ..Outcome::default()
            },
            t0 + Duration::from_secs(4),
        );
        let r = w.rates(t0 + Duration::from_secs(5));
        assert_eq!(r.requests, 10);
        assert_eq!(r.trips_of("prompt_tokens_mismatch"), 1);
        assert_eq!(r.engine_errors, 1);
        assert!((r.share(r.trip_total()) - 0.1).abs() < 1e-9);
        assert_eq!(r.ttft_samples, 8);
    }

    #[test]
    fn old_buckets_slide_out() {
        let w = SignalWindow::new(Duration::from_secs(10));
        let t0 = Instant::now();
        w.record(&ok(5), t0);
        w.record(&ok(5), t0 + Duration::from_secs(6));
        assert_eq!(w.rates(t0 + Duration::from_secs(9)).requests, 2);
        assert_eq!(w.rates(t0 + Duration::from_secs(11)).requests, 1);
        assert_eq!(w.rates(t0 + Duration::from_secs(17)).requests, 0);
        // The slot of the first bucket is reused, not added to.
        w.record(&ok(5), t0 + Duration::from_secs(20));
        assert_eq!(w.rates(t0 + Duration::from_secs(20)).requests, 1);
        w.reset();
        assert_eq!(w.rates(t0 + Duration::from_secs(20)), Rates::default());
    }

    #[test]
    fn p99_is_within_a_bin_of_the_true_value() {
        let w = SignalWindow::new(Duration::from_secs(10));
        let t0 = Instant::now();
        for _ in 0..990 {
            w.record(&ok(10), t0);
        }
        for _ in 0..10 {
            w.record(&ok(800), t0);
        }
        let p99 = w.rates(t0).ttft_p99.unwrap();
        assert!(
            p99 >= Duration::from_millis(10) && p99 < Duration::from_millis(12),
            "{p99:?}"
        );
        for _ in 0..20 {
            w.record(&ok(800), t0);
        }
        let p99 = w.rates(t0).ttft_p99.unwrap();
        assert!(
            p99 >= Duration::from_millis(800) && p99 < Duration::from_millis(960),
            "{p99:?}"
        );
    }
}
