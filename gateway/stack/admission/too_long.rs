//! A prompt refused for its length, and the client's message saying which bound it hit.

use super::Violation;
use crate::error::GatewayError;

/// A refused prompt: what was counted, the limit, and which bound it hit.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.message())]
pub struct PromptTooLong {
    /// The sample (for batches), 0-based.
    pub sample: Option<usize>,
    pub prompt_tokens: u64,
    pub max_new_tokens: u64,
    pub violation: Violation,
    /// The request field holding the prompt.
    pub param: &'static str,
}

impl From<PromptTooLong> for GatewayError {
    fn from(refusal: PromptTooLong) -> Self {
        GatewayError::ContextLengthExceeded {
            message: refusal.message(),
            param: refusal.param,
        }
    }
}

impl PromptTooLong {
    fn message(&self) -> String {
        let which = self
            .sample
            .map(|i| format!(" of sample {i}"))
            .unwrap_or_default();
        let v = &self.violation;
        if v.includes_new_tokens {
            format!(
                "The prompt{which} has {} tokens and asks for up to {} new tokens: {} tokens in all, over the limit of {} set by {}. Shorten the prompt or lower max_tokens.",
                self.prompt_tokens, self.max_new_tokens, v.counted, v.limit, v.bound
            )
        } else {
            format!(
                "The prompt{which} has {} tokens, over the limit of {} tokens set by {}. Shorten the prompt.",
                v.counted, v.limit, v.bound
            )
        }
    }
}
