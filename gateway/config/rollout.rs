//! `[[rollouts]]`: a canary pool beside a stable pool of one model, rolled back on its own
//! when it does worse than the stable pool, and promoted in steps after clean windows.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[[rollouts]]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// A `[[models]].name`.
    pub model: String,
    /// The pool running the current engine version.
    pub stable: String,
    /// The pool running the new engine version.
    pub canary: String,
    /// The sliding window the two pools' rates are measured over.
    #[serde(default = "default_window", with = "humantime_serde")]
    pub window: Duration,
    /// Canary requests in the window before any rate may decide (so three requests cannot).
    #[serde(default = "default_min_requests")]
    pub min_requests: u64,
    /// How much worse than the stable pool the canary may do (`[rollouts.margins]`).
    #[serde(default)]
    pub margins: RollbackMargins,
    /// Automatic promotion in steps (`[rollouts.promotion]`); unset: promotion is manual,
    /// through the admin API.
    #[serde(default)]
    pub promotion: Option<PromotionConfig>,
}

/// `[rollouts.margins]`: the canary is rolled back when its rate exceeds the stable pool's
/// by more than these (rates are shares of requests, 0.01 = one percentage point).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RollbackMargins {
    /// Guard trips (per reason, and all reasons together).
    pub guard_trips: f64,
    /// Engine failures: a 5xx, unreachable, timed out or unreadable.
    pub engine_errors: f64,
    /// Suspected leaks (blocked or not).
    pub leak_suspicions: f64,
    /// The canary's p99 time to first byte may be this many times the stable pool's …
    pub ttft_p99_ratio: f64,
    /// … and must also be this much slower before it counts (fast pools jitter).
    #[serde(with = "humantime_serde")]
    pub ttft_p99_slack: Duration,
}

impl Default for RollbackMargins {
    fn default() -> Self {
        Self {
            guard_trips: 0.01,
            engine_errors: 0.02,
            leak_suspicions: 0.0,
            ttft_p99_ratio: 2.0,
            ttft_p99_slack: Duration::from_millis(100),
        }
    }
}

/// `[rollouts.promotion]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PromotionConfig {
    /// The canary's share of the model's traffic at each step, in percent, rising; the
    /// last step is 100 (the canary takes all traffic: promoted).
    pub steps: Vec<u32>,
    /// A step is taken after this long at the previous one with no breach and at least
    /// `min_requests` canary requests in the window.
    #[serde(with = "humantime_serde")]
    pub clean_window: Duration,
}

fn default_window() -> Duration {
    Duration::from_secs(300)
}

fn default_min_requests() -> u64 {
    200
}

impl RolloutConfig {
    /// The rules of one rollout that need no other section; keys are relative to it
    /// (`margins.guard_trips`). Which models and pools it names is checked across sections.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        let fail = |field: &str, reason: String| Err(Invalid::new(field, reason));
        if self.stable == self.canary {
            return fail("canary", "must be another pool than `stable`".into());
        }
        if self.window.is_zero() {
            return fail("window", "must be positive, e.g. \"5m\"".into());
        }
        if self.min_requests == 0 {
            return fail(
                "min_requests",
                "must be at least 1 (e.g. 200): a handful of requests must not decide".into(),
            );
        }
        let m = &self.margins;
        for (field, v) in [
            ("margins.guard_trips", m.guard_trips),
            ("margins.engine_errors", m.engine_errors),
            ("margins.leak_suspicions", m.leak_suspicions),
        ] {
            if !(0.0..1.0).contains(&v) {
                return fail(
                    field,
                    format!("{v} is not a share of requests in [0, 1), e.g. 0.01"),
                );
            }
        }
        if m.ttft_p99_ratio.is_nan() || m.ttft_p99_ratio < 1.0 {
            return fail(
                "margins.ttft_p99_ratio",
                "must be at least 1, e.g. 2.0".into(),
            );
        }
        if let Some(p) = &self.promotion {
            let rising = p.steps.windows(2).all(|w| w[0] < w[1]);
            if p.steps.is_empty() || !rising || p.steps.last() != Some(&100) || p.steps[0] == 0 {
                return fail(
                    "promotion.steps",
                    "must rise from above 0 to 100 (percent of traffic), e.g. [5, 25, 50, 100]"
                        .into(),
                );
            }
            if p.clean_window.is_zero() {
                return fail(
                    "promotion.clean_window",
                    "must be positive, e.g. \"10m\"".into(),
                );
            }
        }
        Ok(())
    }
}
