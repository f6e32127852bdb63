//! What goes in and out of a pool's queue: an entry asking for a turn, the head a release
//! asks about, why a request got no turn, and what the queue holds now.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use super::{MIN_RETRY, UNKNOWN_RATE_RETRY};
use crate::config::Priority;

/// One request asking for a turn.
#[derive(Debug, Clone)]
pub struct QueueEntry {
    pub tenant: Arc<str>,
    /// The tenant's share against the others of its class (0 counts as 1).
    pub weight: u32,
    pub class: Priority,
    /// KV tokens it will hold: prompt + max new tokens.
    pub cost: u64,
    /// When it stops waiting ([`Ticket::turn`] answers `TimedOut`).
    pub deadline: Instant,
    /// Its tenant is below its fair share of the pool (`fleet::share`): it goes ahead of
    /// the backlogged tenants' heads, as a sparse tenant does, and may take kept room.
    pub under_share: bool,
}

/// The head of the queue, as [`FairQueue::release_with`] asks about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub tenant: Arc<str>,
    pub cost: u64,
    pub under_share: bool,
}

/// Why a request got no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum QueueRefusal {
    /// The queue is full and holds nothing of a lower class to shed.
    #[error("the pool's queue is full")]
    Full,
    /// Pushed out of a full queue by a request of a higher class.
    #[error("the request was shed from the pool's queue for a higher-priority request")]
    Shed,
    /// Its deadline passed while it waited.
    #[error("the request waited in the pool's queue until its deadline")]
    TimedOut,
    /// The queue was closed (its pool or generation went away).
    #[error("the pool's queue was closed")]
    Closed,
    /// kvgate is shutting down: nothing queued is dispatched any more (another replica
    /// answers a retry).
    #[error("kvgate is shutting down")]
    Draining,
}

impl QueueRefusal {
    /// A `Retry-After` hint that needs no queue: 1 s after `Closed` (the next generation
    /// answers at once), 5 s otherwise. The refusal carries no data (its variants are
    /// matched by value), so the drain-rate hint is [`FairQueue::retry_after`]: ask the
    /// queue that refused.
    pub fn retry_after(&self) -> Duration {
        match self {
            QueueRefusal::Closed | QueueRefusal::Draining => MIN_RETRY,
            QueueRefusal::Full | QueueRefusal::Shed | QueueRefusal::TimedOut => UNKNOWN_RATE_RETRY,
        }
    }

    /// A low-cardinality label for metrics and logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            QueueRefusal::Full => "full",
            QueueRefusal::Shed => "shed",
            QueueRefusal::TimedOut => "timed_out",
            QueueRefusal::Closed => "closed",
            QueueRefusal::Draining => "draining",
        }
    }
}

/// What the queue holds now, for metrics and the status page.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueSnapshot {
    /// Entries waiting.
    pub len: usize,
    /// The bound (`scheduling.max_queued`).
    pub max_queued: usize,
    /// Entries waiting per class, lowest class first.
    pub by_class: [(Priority, usize); 3],
    /// Entries waiting per tenant (tenants with none are left out), by name.
    pub by_tenant: Vec<(Arc<str>, usize)>,
    /// How long the oldest waiting entry has waited (zero when empty).
    pub oldest_wait: Duration,
    /// Entries released per second over the last 10 s.
    pub drain_rate: f64,
}
