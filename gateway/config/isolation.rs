//! `[isolation]`: tenant isolation, i.e. the per-tenant cache salts and the leak detector, and
//! the leak detector's modes that pools and tenants choose.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[isolation]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IsolationConfig {
    /// Environment variable holding the secret the per-tenant cache salts derive from
    /// (keep it equal across replicas). Unset or empty: a random secret per start.
    pub salt_secret_env: Option<String>,
    /// Text units (words, other characters) per fingerprinted n-gram.
    pub ngram: usize,
    /// How long prompts are remembered.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Memory bound: stored n-gram hashes across all tenants.
    pub max_entries: usize,
    /// Distinct foreign n-grams before an answer is a suspected leak.
    pub min_matches: usize,
    /// Bytes of each prompt fingerprinted (its tail, where the incident's leaks came from);
    /// bounds the cost of encoding million-token prompts.
    pub fingerprint_bytes: bytesize::ByteSize,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        Self {
            salt_secret_env: None,
            ngram: 8,
            window: Duration::from_secs(600),
            max_entries: 1_000_000,
            min_matches: 2,
            fingerprint_bytes: bytesize::ByteSize::kib(256),
        }
    }
}

impl IsolationConfig {
    /// The rules of `[isolation]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.ngram == 0 || self.min_matches == 0 || self.max_entries == 0 {
            return Err(Invalid::new(
                "isolation",
                "ngram, min_matches and max_entries must be at least 1",
            ));
        }
        Ok(())
    }
}

/// What the leak detector does when an answer holds other tenants' prompt fragments.
/// Ordered from the least to the most protective: where a pool and a tenant both set one,
/// the stricter applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakMode {
    /// Do not fingerprint or scan.
    Off,
    /// Audit line and `kvgate_leak_suspected_total`; the answer is delivered.
    Detect,
    /// As detect, and the answer is stopped (502, or an error event in a stream). A stream's
    /// events leave as they are checked; output is held only while the answer's newest
    /// units continue a run of another tenant's text, so at most `ngram - 1` units of a
    /// run that trips reach the client. The default: a leak with the right usage and no
    /// marker (the incident's v3 shape) is only stopped here.
    #[default]
    Block,
    /// As block, and every stream is held back by `ngram + min_matches` units, so not one
    /// unit of a run that trips reaches the client; costs every stream that hold-back in
    /// time to first token. For pools of tenants whose prompts hold secrets.
    Strict,
}

impl LeakMode {
    /// Scan answers at all (and fingerprint prompts).
    pub fn is_on(self) -> bool {
        self != LeakMode::Off
    }

    /// Stop an answer that trips (block and strict).
    pub fn blocks(self) -> bool {
        self >= LeakMode::Block
    }
}
