//! `[admission]`: token counting and capacity checks.

use serde::Deserialize;

use super::invalid::Invalid;

/// `[admission]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Refuse to start when a context window exceeds the smallest KV pool on its path (I4);
    /// `kvgate check --strict` applies the same rule.
    pub strict: bool,
    /// Exact token counts running at once on the blocking pool (default: CPU cores).
    pub max_concurrent_counts: Option<usize>,
}

impl AdmissionConfig {
    /// The rules of `[admission]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.max_concurrent_counts == Some(0) {
            return Err(Invalid::new(
                "admission.max_concurrent_counts",
                "must be at least 1, or left out to use one per CPU core",
            ));
        }
        Ok(())
    }
}
