//! One request's contribution to its pool's window, gathered as the request goes and
//! counted once, when the last holder lets go of it.
//!
//! The observe stage makes it and notes the time to first byte and engine failures; the
//! guard notes trips and leak suspicions, mid-stream ones included (its stream holds a
//! clone until the stream ends). Counting on drop means every request is counted exactly
//! once however it ends: an error, a finished stream, a client that went away.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::fleet::{Outcome, OutcomeWatch, Pool};
use crate::stack::routing::ServedBy;

/// The signals of one request (a request extension, shared as `Arc`).
#[derive(Debug)]
pub struct RequestSignals {
    pool: Arc<Pool>,
    /// Looks at the pool's window once this request counted in it (a canary's rollout).
    watch: Arc<dyn OutcomeWatch>,
    outcome: Mutex<Outcome>,
    /// The workers that answered (set by the guard): the outcome also counts for their
    /// outlier ejection.
    served: OnceLock<ServedBy>,
    /// The trip was in the prefill leg's answer: the prefill worker is to blame.
    prefill_blamed: AtomicBool,
}

impl RequestSignals {
    /// Signals for a request served by `pool`.
    pub fn new(pool: Arc<Pool>, watch: Arc<dyn OutcomeWatch>) -> Self {
        Self {
            pool,
            watch,
            outcome: Mutex::new(Outcome::default()),
            served: OnceLock::new(),
            prefill_blamed: AtomicBool::new(false),
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

    /// The workers that answered.
    pub fn served_by(&self, served: ServedBy) {
        let _ = self.served.set(served);
    }

    /// The trip about to be noted was in the prefill leg's answer.
    pub fn blame_prefill(&self) {
        self.prefill_blamed.store(true, Ordering::Relaxed);
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

/// Whether a guard trip shows what the engine *did* (aborted, miscounted the prompt, broke
/// or stalled the stream), which counts towards ejecting the worker. What an answer *says*
/// (a placeholder marker, another tenant's text) can be provoked by a tenant's own prompt,
/// so it never ejects a worker others share.
fn engine_fault(trip: &str) -> bool {
    !matches!(trip, "placeholder_marker" | "leak_suspected")
}

impl Drop for RequestSignals {
    fn drop(&mut self) {
        let mut outcome = *self.outcome.get_mut().unwrap_or_else(|p| p.into_inner());
        // A trip explains the failure (a stalled stream is a trip, not also an engine
        // error): one request, one signal.
        if outcome.trip.is_some() {
            outcome.engine_error = false;
        }
        if let Some(served) = self.served.get() {
            // Engine failures were counted by dispatch's legs, on the worker that failed.
            if let Some(trip) = outcome.trip {
                let blamed = if !engine_fault(trip) {
                    None
                } else if self.prefill_blamed.load(Ordering::Relaxed) {
                    served.prefill.as_ref()
                } else {
                    Some(&served.worker)
                };
                if let Some(worker) = blamed {
                    worker.request_failed("guard_trip");
                }
            } else if !outcome.engine_error && outcome.ttft.is_some() {
                served.worker.request_succeeded();
                if let Some(prefill) = &served.prefill {
                    prefill.request_succeeded();
                }
            }
        }
        let now = Instant::now();
        self.pool.signals.record(&outcome, now);
        self.watch.counted(&self.pool, now);
    }
}
