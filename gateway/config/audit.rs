//! `[audit]`: where audit lines go.

use serde::Deserialize;
use std::path::PathBuf;

use super::invalid::Invalid;

/// `[audit]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `stderr` (default), `file` (then `path`) or `none`.
    pub sink: AuditSink,
    /// The file for `sink = "file"` (appended to).
    pub path: Option<PathBuf>,
}

impl AuditConfig {
    /// The rules of `[audit]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.sink == AuditSink::File && self.path.is_none() {
            return Err(Invalid::new(
                "audit.path",
                "audit.sink = \"file\" needs a path, e.g. path = \"/var/log/kvgate/audit.jsonl\"",
            ));
        }
        Ok(())
    }
}

/// Where audit lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditSink {
    #[default]
    Stderr,
    File,
    None,
}
