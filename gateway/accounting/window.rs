//! A tenant's last hour for the status page: requests by outcome and tokens, in one-minute
//! buckets. Written once per settled request (a short lock of this tenant's own ring);
//! read by the page.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::{Outcome, TokenUsage};

/// Minutes kept.
pub const HOUR_MINUTES: usize = 60;

/// Counts over some minutes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HourCounts {
    pub requests: u64,
    /// Requests whose outcome was not `ok`.
    pub errors: u64,
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
}

impl HourCounts {
    fn add(&mut self, outcome: Outcome, usage: Option<TokenUsage>) {
        self.requests += 1;
        if outcome != Outcome::Ok {
            self.errors += 1;
        }
        if let Some(u) = usage {
            self.prompt += u.prompt;
            self.completion += u.completion;
            self.cached += u.cached;
        }
    }

    fn plus(mut self, o: &Self) -> Self {
        self.requests += o.requests;
        self.errors += o.errors;
        self.prompt += o.prompt;
        self.completion += o.completion;
        self.cached += o.cached;
        self
    }
}

/// One tenant's last hour.
#[derive(Debug)]
pub struct TenantHour {
    tenant: Arc<str>,
    /// When minute 0 began (minutes are counted from here).
    epoch: Instant,
    /// (minute, counts), oldest first, at most [`HOUR_MINUTES`].
    ring: Mutex<VecDeque<(u64, HourCounts)>>,
}

impl TenantHour {
    pub(super) fn new(tenant: Arc<str>) -> Self {
        Self {
            tenant,
            epoch: Instant::now(),
            ring: Mutex::new(VecDeque::with_capacity(HOUR_MINUTES)),
        }
    }

    /// The tenant's configured name.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    fn minute(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_secs() / 60
    }

    pub(super) fn add(&self, outcome: Outcome, usage: Option<TokenUsage>) {
        self.add_at(Instant::now(), outcome, usage);
    }

    pub(super) fn add_at(&self, at: Instant, outcome: Outcome, usage: Option<TokenUsage>) {
        let minute = self.minute(at);
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        match ring.back_mut() {
            Some((m, counts)) if *m == minute => counts.add(outcome, usage),
            _ => {
                let mut counts = HourCounts::default();
                counts.add(outcome, usage);
                ring.push_back((minute, counts));
                while ring.len() > HOUR_MINUTES {
                    ring.pop_front();
                }
            }
        }
    }

    /// The counts of the last hour as of `now`.
    pub fn last_hour(&self, now: Instant) -> HourCounts {
        let now = self.minute(now);
        let oldest = now.saturating_sub(HOUR_MINUTES as u64 - 1);
        self.ring
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(m, _)| *m >= oldest && *m <= now)
            .fold(HourCounts::default(), |sum, (_, c)| sum.plus(c))
    }
}
