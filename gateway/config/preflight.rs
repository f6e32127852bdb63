//! `[preflight]`: how much `kvgate preflight` may spend proving a deployment safe.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[preflight]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreflightConfig {
    /// Prompt tokens all probes together may send (a probe that would go over is SKIPPED,
    /// and a run with a skipped probe does not pass). `--token-budget` overrides it.
    pub token_budget: u64,
    /// How long one probe may take, headers to last byte.
    #[serde(with = "humantime_serde")]
    pub probe_timeout: Duration,
    /// New tokens each probe asks for (enough to read an answer, little enough to fit
    /// beside a prompt at the worker's limit).
    pub max_new_tokens: u64,
}

impl Default for PreflightConfig {
    fn default() -> Self {
        Self {
            token_budget: 4_000_000,
            probe_timeout: Duration::from_secs(120),
            max_new_tokens: 4,
        }
    }
}

impl PreflightConfig {
    /// The rules of `[preflight]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.token_budget == 0 {
            return Err(Invalid::new(
                "preflight.token_budget",
                "must be above 0 (a budget of nothing skips every probe)",
            ));
        }
        if self.probe_timeout.is_zero() {
            return Err(Invalid::new(
                "preflight.probe_timeout",
                "must be above 0, e.g. \"120s\"",
            ));
        }
        if !(1..=64).contains(&self.max_new_tokens) {
            return Err(Invalid::new(
                "preflight.max_new_tokens",
                "must be 1 to 64: the probe at limit − 1 must still fit the KV pool with it",
            ));
        }
        Ok(())
    }
}
