//! One exchange with one engine (a leg: the unified worker, or the prefill or decode side of
//! a PD pair) and its single `kvgate_upstream_requests_total` outcome.
//!
//! Every leg that was started is counted exactly once, when its outcome is known: `ok`,
//! `status_4xx`, `status_5xx`, the error code of a failure (`upstream_unavailable`,
//! `upstream_timeout`, `upstream_protocol_error`, `overloaded`), or `cancelled` when it was
//! dropped unfinished (the other PD leg failed first, or the client went away). So the
//! counter reconciles with what the engines received.
//!
//! An engine failure (unreachable, timed out, unreadable, 5xx) also counts towards the
//! worker's outlier ejection; successes and guard trips are known only once the guard has
//! read the answer, so `rollout::signals` reports those.

use std::sync::Arc;

use crate::metrics;
use crate::stack::routing::Worker;

/// A started leg; counts its outcome once (on [`Leg::finish`], or as `cancelled` on drop).
#[derive(Debug)]
pub(super) struct Leg {
    worker: Arc<Worker>,
    outcome: Option<&'static str>,
}

impl Leg {
    /// A leg to `worker` starts now.
    pub fn start(worker: &Arc<Worker>) -> Self {
        Self {
            worker: worker.clone(),
            outcome: None,
        }
    }

    /// The leg's outcome is known; the first one set is the one counted.
    pub fn finish(&mut self, outcome: &'static str) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = Some(outcome);
        if matches!(
            outcome,
            "upstream_unavailable" | "upstream_timeout" | "upstream_protocol_error" | "status_5xx"
        ) {
            self.worker.request_failed(outcome);
        }
    }
}

impl Drop for Leg {
    fn drop(&mut self) {
        ::metrics::counter!(
            metrics::UPSTREAM_REQUESTS_TOTAL,
            "pool" => ::metrics::SharedString::from(self.worker.pool.clone()),
            "role" => self.worker.role.as_str(),
            "outcome" => self.outcome.unwrap_or("cancelled")
        )
        .increment(1);
    }
}
