//! `[limits]`: where tenant rate and concurrency counters live.

use serde::Deserialize;

use super::invalid::Invalid;

/// `[limits]`: where tenant rate and concurrency counters live.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// `memory` (this gateway alone) or `redis` (shared by every replica).
    pub backend: LimitsBackend,
    /// For `redis`: `redis://host:6379/0` or `unix:///path/redis.sock`.
    pub redis_url: Option<String>,
    /// Key prefix in Redis (several deployments can share one Redis).
    pub key_prefix: String,
    /// When Redis cannot be reached: `fail_open` (serve, unlimited) or `fail_closed` (429).
    pub failure_policy: LimitsFailurePolicy,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            backend: LimitsBackend::Memory,
            redis_url: None,
            key_prefix: "kvgate".into(),
            failure_policy: LimitsFailurePolicy::FailOpen,
        }
    }
}

impl LimitsConfig {
    /// The rules of `[limits]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.backend == LimitsBackend::Redis && self.redis_url.is_none() {
            return Err(Invalid::new(
                "limits.redis_url",
                "backend = \"redis\" needs redis_url, e.g. \"redis://10.0.0.9:6379/0\"",
            ));
        }
        Ok(())
    }
}

/// Where limit counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsBackend {
    Memory,
    Redis,
}

/// What to do when the limit store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsFailurePolicy {
    FailOpen,
    FailClosed,
}
