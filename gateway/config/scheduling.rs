//! `[scheduling]`: the per-pool gateway queue that holds requests while a pool is full
//! (issue 30), instead of pushing them into the engines' backlog or refusing them at once.
//!
//! Read per generation: a reload applies it to requests that arrive after it.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::{self, Invalid};

/// The largest `max_queued`: a queue holds this many requests' bodies in memory at most.
const MOST_QUEUED: usize = 1_000_000;
/// The largest `kv_overcommit`: beyond, the engines' own backlog is the queue again.
const MOST_OVERCOMMIT: f64 = 16.0;
/// The largest `fair_share_reserve`: tenants at their share always keep half the pool.
const MOST_RESERVE: f64 = 0.5;

/// `[scheduling]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulingConfig {
    /// Queue requests at the gateway when a pool is full (off: the engines queue them).
    pub enabled: bool,
    /// Requests waiting per pool; beyond, a lower class is shed or the request refused.
    pub max_queued: usize,
    /// Longest a request waits in the queue before it is refused.
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// The share of a worker's KV pool the gateway may have in flight (1.0: exactly the
    /// pool; above: the engine may queue or preempt the excess).
    pub kv_overcommit: f64,
    /// The most of a pool's KV kept free for tenants below their fair share while the pool
    /// is full (the room they recently used, so their next request needs no wait); 0: none.
    pub fair_share_reserve: f64,
    /// The part of `fair_share_reserve` kept spare while a tenant is at or above its share,
    /// in whole requests, for any request below its tenant's share: a tenant arriving
    /// while a flood is on (no history, no room of its own yet) is served at once instead
    /// of after the next wave of answers; 0: none. None is kept on a pool only one
    /// tenant may use (no newcomer can come). Counted within `fair_share_reserve`: the most kept in all.
    pub newcomer_reserve: f64,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_queued: 256,
            queue_timeout: Duration::from_secs(30),
            kv_overcommit: 1.0,
            fair_share_reserve: 0.25,
            newcomer_reserve: 0.1,
        }
    }
}

impl SchedulingConfig {
    /// The rules of `[scheduling]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.max_queued == 0 || self.max_queued > MOST_QUEUED {
            return Err(Invalid::new(
                "scheduling.max_queued",
                format!(
                    "must be between 1 and {MOST_QUEUED}; to queue nothing, set `enabled = false`"
                ),
            ));
        }
        invalid::deadline("scheduling.queue_timeout", self.queue_timeout)?;
        if !(self.kv_overcommit.is_finite()
            && (1.0..=MOST_OVERCOMMIT).contains(&self.kv_overcommit))
        {
            return Err(Invalid::new(
                "scheduling.kv_overcommit",
                format!("must be between 1.0 (exactly the KV pool) and {MOST_OVERCOMMIT}"),
            ));
        }
        if !(self.fair_share_reserve.is_finite()
            && (0.0..=MOST_RESERVE).contains(&self.fair_share_reserve))
        {
            return Err(Invalid::new(
                "scheduling.fair_share_reserve",
                format!(
                    "must be between 0.0 (keep no room for tenants below their share) and {MOST_RESERVE} (a fraction of each pool's KV)"
                ),
            ));
        }
        if !(self.newcomer_reserve.is_finite()
            && (0.0..=MOST_RESERVE).contains(&self.newcomer_reserve))
        {
            return Err(Invalid::new(
                "scheduling.newcomer_reserve",
                format!(
                    "must be between 0.0 (keep no spare room for newcomers) and {MOST_RESERVE} (a fraction of each pool's KV, counted within fair_share_reserve)"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bound_names_its_key() {
        assert_eq!(SchedulingConfig::default().check(), Ok(()));
        let key = |c: SchedulingConfig| c.check().err().map(|e| e.key);
        let base = SchedulingConfig::default;
        assert_eq!(
            key(SchedulingConfig {
                max_queued: 0,
                ..base()
            })
            .as_deref(),
            Some("scheduling.max_queued")
        );
        assert_eq!(
            key(SchedulingConfig {
                queue_timeout: Duration::ZERO,
                ..base()
            })
            .as_deref(),
            Some("scheduling.queue_timeout")
        );
        for bad in [0.99, f64::NAN, f64::INFINITY, 17.0] {
            assert_eq!(
                key(SchedulingConfig {
                    kv_overcommit: bad,
                    ..base()
                })
                .as_deref(),
                Some("scheduling.kv_overcommit")
            );
        }
        assert_eq!(
            key(SchedulingConfig {
                kv_overcommit: 1.5,
                ..base()
            }),
            None
        );
        for bad in [-0.1, 0.51, f64::NAN] {
            assert_eq!(
                key(SchedulingConfig {
                    fair_share_reserve: bad,
                    ..base()
                })
                .as_deref(),
                Some("scheduling.fair_share_reserve")
            );
            assert_eq!(
                key(SchedulingConfig {
                    newcomer_reserve: bad,
                    ..base()
                })
                .as_deref(),
                Some("scheduling.newcomer_reserve")
            );
        }
    }
}
