//! `[pools.guard]`: how the responses of a pool are checked (I1).

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[pools.guard]`: how the responses of a pool are checked (I1).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Check responses at all. Off only to test other defences; never in production.
    pub enabled: bool,
    /// Literal strings whose presence in generated text marks a placeholder answer.
    pub markers: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) that mark a placeholder answer.
    pub marker_patterns: Vec<String>,
    /// Allowed difference between the engine's `prompt_tokens` and kvgate's count for text
    /// and chat prompts (token-id prompts are always compared exactly).
    pub prompt_tokens_tolerance: u64,
    /// How long the status line may be held while the first stream event is awaited.
    #[serde(with = "humantime_serde")]
    pub first_event_timeout: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            markers: Vec::new(),
            marker_patterns: Vec::new(),
            prompt_tokens_tolerance: 0,
            first_event_timeout: Duration::from_secs(60),
        }
    }
}

impl GuardConfig {
    /// The rules of one pool's guard; keys are relative to it (`markers`).
    pub(super) fn check(&self) -> Result<(), Invalid> {
        for (j, pattern) in self.marker_patterns.iter().enumerate() {
            if let Err(e) = regex::Regex::new(pattern) {
                return Err(Invalid::new(
                    format!("marker_patterns[{j}]"),
                    format!("not a valid regular expression: {e}"),
                ));
            }
        }
        if self.markers.iter().any(String::is_empty) {
            return Err(Invalid::new(
                "markers",
                "an empty marker would match every answer; remove it",
            ));
        }
        Ok(())
    }
}
