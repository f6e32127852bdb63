//! A queue's recent drain rate: releases per second over a sliding window, in one-second
//! buckets (at most 10 of them).

use std::collections::VecDeque;
use tokio::time::Instant;

/// The drain rate counts releases over this window.
const DRAIN_WINDOW_SECS: u64 = 10;

/// Releases per second over a sliding window, in one-second buckets.
pub(super) struct Drain {
    origin: Instant,
    buckets: VecDeque<(u64, u32)>,
}

// === impl Drain ===

impl Drain {
    pub(super) fn new(origin: Instant) -> Self {
        Self {
            origin,
            buckets: VecDeque::new(),
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

    /// Releases per second over the window (a young queue divides by its age, at least 1 s).
    pub(super) fn rate(&self, now: Instant) -> f64 {
        let second = self.second(now);
        let released: u64 = self
            .buckets
            .iter()
            .filter(|(s, _)| s + DRAIN_WINDOW_SECS > second)
            .map(|(_, count)| u64::from(*count))
            .sum();
        let age = now.saturating_duration_since(self.origin).as_secs_f64();
        released as f64 / age.clamp(1.0, DRAIN_WINDOW_SECS as f64)
    }
}
