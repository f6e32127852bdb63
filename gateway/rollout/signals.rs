//! One request's contribution to its pool's window, gathered as the request goes and
//! counted once, when the last holder lets go of it.
//!
//! The observe stage makes it and notes the time to first byte and engine failures; the
//! guard notes trips and leak suspicions, mid-stream ones included (its stream holds a
//! clone until the stream ends). Counting on drop means every request is counted exactly
//! once however it ends: an error, a finished stream, a client that went away.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::controller::Rollout;
use super::window::Outcome;
use crate::stack::routing::Pool;

/// The signals of one request (a request extension, shared as `Arc`).
#[derive(Debug)]
pub struct RequestSignals {
    pool: Arc<Pool>,
    /// The rollout the pool is the canary of: it looks again after each canary request.
    rollout: Option<Arc<Rollout>>,
    outcome: Mutex<Outcome>,
}

impl RequestSignals {
    /// Signals for a request served by `pool`.
    pub fn new(pool: Arc<Pool>, rollout: Option<Arc<Rollout>>) -> Self {
        Self {
            pool,
            rollout,
            outcome: Mutex::new(Outcome::default()),
        }
    }

    fn with(&self, f: impl FnOnce(&mut Outcome)) {
        let mut outcome = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut outcome);
    }

    /// A guard trip (the first one is kept).
    pub fn trip(&self, reason: &'static str) {
        self.with(|o| {
            o.trip.get_or_insert(reason);
        });
    }

    /// A suspected leak.
    pub fn leak(&self) {
        self.with(|o| o.leak = true);
    }

    /// The engine failed (5xx, unreachable, timed out, unreadable).
    pub fn engine_error(&self) {
        self.with(|o| o.engine_error = true);
    }

    /// The answer's first byte went out after `elapsed`.
    pub fn first_byte(&self, elapsed: Duration) {
        self.with(|o| o.ttft = Some(elapsed));
    }
}

impl Drop for RequestSignals {
    fn drop(&mut self) {
        let mut outcome = *self.outcome.get_mut().unwrap_or_else(|p| p.into_inner());
        // A trip explains the failure (a stalled stream is a trip, not also an engine
        // error): one request, one signal.
        if outcome.trip.is_some() {
            outcome.engine_error = false;
        }
        let now = Instant::now();
        self.pool.signals.record(&outcome, now);
        if let Some(rollout) = &self.rollout {
            rollout.evaluate(now);
        }
    }
}
