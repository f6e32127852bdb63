//! What a broken rule reports: the key it is about and the fix, without the file (the
//! loader adds that when it turns an [`Invalid`] into a `ConfigError`).

use std::time::Duration;

/// One broken rule: the key path (`pools[1].prefill[0].kv_tokens`) and the reason, which
/// says how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub key: String,
    pub reason: String,
}

impl Invalid {
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The same rule seen from the list holding the item: a pool's `model` becomes
    /// `pools[3].model`. Items of a list name their keys relative to themselves, as they
    /// do not know where they sit.
    pub fn under(self, prefix: &str) -> Self {
        Self {
            key: format!("{prefix}.{}", self.key),
            reason: self.reason,
        }
    }
}

/// Deadlines are added to the clock on every request: zero would turn a guard off, and a
/// year-long value would overflow.
pub(super) fn deadline(key: &str, value: Duration) -> Result<(), Invalid> {
    const LONGEST: Duration = Duration::from_secs(7 * 24 * 3600);
    if value.is_zero() {
        return Err(Invalid::new(key, "must be positive, e.g. \"10s\""));
    }
    if value > LONGEST {
        return Err(Invalid::new(key, "must be at most 7 days"));
    }
    Ok(())
}
