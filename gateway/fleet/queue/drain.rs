//! A queue's recent drain rate: releases per second over a sliding window, in one-second
//! buckets (at most 10 of them), counted over the time the queue was busy (not empty) in
//! that window: after a quiet period the first releases give the pool's pace, not that pace
//! averaged over the idle seconds before (issue 38: Retry-After said 26 s while the pool freed
//! a slot every 1.6 s).

use std::collections::VecDeque;
use tokio::time::Instant;

/// The drain rate counts releases over this window.
const DRAIN_WINDOW_SECS: u64 = 10;

/// Releases per second over a sliding window, in one-second buckets.
pub(super) struct Drain {
    origin: Instant,
    buckets: VecDeque<(u64, u32)>,
    /// Since when the queue holds entries (None: it is empty).
    busy_since: Option<Instant>,
}

// === impl Drain ===

impl Drain {
    pub(super) fn new(origin: Instant) -> Self {
        Self {
            origin,
            buckets: VecDeque::new(),
            busy_since: None,
        }
    }

    /// The queue now holds `len` entries: a busy period starts when it stops being empty
    /// and ends when it is empty again.
    pub(super) fn holding(&mut self, len: usize, now: Instant) {
        match (len, self.busy_since) {
            (0, _) => self.busy_since = None,
            (_, None) => self.busy_since = Some(now),
            _ => {}
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    pub(super) fn record(&mut self, now: Instant) {
        let second = self.second(now);
        match self.buckets.back_mut() {
            Some((s, count)) if *s == second => *count = count.saturating_add(1),
            _ => self.buckets.push_back((second, 1)),
        }
        while self
            .buckets
            .front()
            .is_some_and(|(s, _)| s + DRAIN_WINDOW_SECS <= second)
        {
            self.buckets.pop_front();
        }
    }

    /// Releases per second over the window: while busy, over the busy part of it (its
    /// releases over its length, at least 1 s); while empty, over the window (a young
    /// queue's over its age, at least 1 s).
    pub(super) fn rate(&self, now: Instant) -> f64 {
        let second = self.second(now);
        let window = DRAIN_WINDOW_SECS as f64;
        let (from, span) = match self.busy_since {
            Some(busy) => {
                let busy_for = now.saturating_duration_since(busy).as_secs_f64();
                (self.second(busy), busy_for.min(window))
            }
            None => (0, now.saturating_duration_since(self.origin).as_secs_f64()),
        };
        let released: u64 = self
            .buckets
            .iter()
            .filter(|(s, _)| s + DRAIN_WINDOW_SECS > second && *s >= from)
            .map(|(_, count)| u64::from(*count))
            .sum();
        released as f64 / span.clamp(1.0, window)
    }
}
