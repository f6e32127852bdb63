//! `[health]`: active health checks of every worker and passive outlier ejection.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[health]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Probe every worker on an interval (`/health`, a pool's `health_path`, or `/v1/models`
    /// for OpenAI-style engines). Off: only passive ejection takes workers out.
    pub active: bool,
    /// Time between two probes of one worker.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How long one probe may take (a slower answer is a failed probe).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// Failed probes in a row that take a worker out of service.
    pub unhealthy_threshold: u32,
    /// Passed probes in a row that bring it back (after its capacity was discovered again).
    pub healthy_threshold: u32,
    /// Passive outlier ejection (`[health.outlier]`).
    pub outlier: OutlierConfig,
}

/// `[health.outlier]`: ejection of a worker whose requests keep failing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Failures in a row on one worker (connect failures, 5xx, timeouts, unreadable
    /// answers, guard trips) that eject it. 0 turns passive ejection off.
    pub consecutive_failures: u32,
    /// How long the first ejection lasts; each further one doubles it.
    #[serde(with = "humantime_serde")]
    pub base_ejection: Duration,
    /// The longest an ejection lasts.
    #[serde(with = "humantime_serde")]
    pub max_ejection: Duration,
    /// Largest share of one pool's workers of a role that may be ejected at once (rounded
    /// down: a pool of one worker is never ejected below 1.0).
    pub max_ejected_share: f64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            active: true,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            unhealthy_threshold: 3,
            healthy_threshold: 2,
            outlier: OutlierConfig::default(),
        }
    }
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
            max_ejected_share: 0.5,
        }
    }
}

impl HealthConfig {
    /// The rules of `[health]` and `[health.outlier]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        let fail = |key: &str, reason: &str| Err(Invalid::new(format!("health.{key}"), reason));
        if self.interval.is_zero() {
            return fail(
                "interval",
                "must be above 0, e.g. \"5s\" (set health.active = false to stop probing)",
            );
        }
        if self.timeout.is_zero() || self.timeout > self.interval {
            return fail(
                "timeout",
                "must be above 0 and at most health.interval, so probes never overlap",
            );
        }
        if self.unhealthy_threshold == 0 {
            return fail("unhealthy_threshold", "must be at least 1");
        }
        if self.healthy_threshold == 0 {
            return fail("healthy_threshold", "must be at least 1");
        }
        let outlier = &self.outlier;
        if outlier.base_ejection.is_zero() {
            return fail("outlier.base_ejection", "must be above 0, e.g. \"10s\"");
        }
        if outlier.max_ejection < outlier.base_ejection {
            return fail(
                "outlier.max_ejection",
                "must be at least health.outlier.base_ejection",
            );
        }
        if !(0.0..=1.0).contains(&outlier.max_ejected_share) {
            return fail(
                "outlier.max_ejected_share",
                "must be between 0.0 and 1.0 (a share of a pool's workers)",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_key() {
        assert!(HealthConfig::default().check().is_ok());
        let mut c = HealthConfig {
            timeout: Duration::from_secs(10),
            ..HealthConfig::default()
        };
        assert_eq!(c.check().unwrap_err().key, "health.timeout");
        c.timeout = Duration::from_secs(1);
        c.outlier.max_ejected_share = 1.5;
        assert_eq!(
            c.check().unwrap_err().key,
            "health.outlier.max_ejected_share"
        );
        c.outlier.max_ejected_share = 0.5;
        c.outlier.max_ejection = Duration::from_secs(1);
        assert_eq!(c.check().unwrap_err().key, "health.outlier.max_ejection");
    }
}
