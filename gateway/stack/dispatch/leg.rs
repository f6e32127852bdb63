//! One exchange with one engine (a leg: the unified worker, or the prefill or decode side of
//! a PD pair) and its single `kvgate_upstream_requests_total` outcome.
//!
//! Every leg that was started is counted exactly once, when its outcome is known: `ok`,
//! `status_4xx`, `status_5xx`, the error code of a failure (`upstream_unavailable`,
//! `upstream_timeout`, `upstream_protocol_error`, `overloaded`), or `cancelled` when it was
//! dropped unfinished (the other PD leg failed first, or the client went away). So the
//! counter reconciles with what the engines received.

use std::sync::Arc;

use crate::metrics;
use crate::stack::routing::Worker;

/// A started leg; counts its outcome once (on [`Leg::finish`], or as `cancelled` on drop).
#[derive(Debug)]
pub(super) struct Leg {
    pool: Arc<str>,
    role: &'static str,
    outcome: Option<&'static str>,
}

impl Leg {
    /// A leg to `worker` starts now.
    pub fn start(worker: &Worker) -> Self {
        Self {
            pool: worker.pool.clone(),
            role: worker.role.as_str(),
            outcome: None,
        }
    }

    /// The leg's outcome is known; the first one set is the one counted.
    pub fn finish(&mut self, outcome: &'static str) {
        self.outcome.get_or_insert(outcome);
    }
}

impl Drop for Leg {
    fn drop(&mut self) {
        ::metrics::counter!(
            metrics::UPSTREAM_REQUESTS_TOTAL,
            "pool" => ::metrics::SharedString::from(self.pool.clone()),
            "role" => self.role,
            "outcome" => self.outcome.unwrap_or("cancelled")
        )
        .increment(1);
    }
}
