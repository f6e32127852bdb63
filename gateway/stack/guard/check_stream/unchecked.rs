//! A stream whose pool's checks are off is still read for the tenant's account: the usage
//! its events report, and which samples ended (the usage strip needs that).

use serde_json::Value;

use super::StreamCheck;
use crate::accounting::TokenUsage;
use crate::stack::guard::inspect::Shape;

impl StreamCheck {
    /// The usage an unchecked event reports (and its samples' ends, which the usage
    /// strip needs): `Some((has_usage, no_choices))` for an OpenAI chunk.
    pub(super) fn read_usage_unchecked(&mut self, v: &Value) -> Option<(bool, bool)> {
        match self.shape {
            Shape::Native => {
                let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if let Some(split) = v.get("meta_info").and_then(TokenUsage::from_meta) {
                    self.usage.sample(index, split.prompt + split.completion);
                    self.usage.sample_split(index, split);
                }
                None
            }
            Shape::OpenAi => {
                let choices = v.get("choices").and_then(Value::as_array);
                let no_choices = choices.is_none_or(|c| c.is_empty());
                for choice in choices.into_iter().flatten() {
                    let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    self.seen.insert(index);
                    if choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
                        self.finished.insert(index);
                    }
                }
                let usage = v.get("usage").filter(|u| !u.is_null());
                if let Some(split) = usage.and_then(TokenUsage::from_usage) {
                    let total = split.prompt + split.completion;
                    if no_choices {
                        self.usage.final_total(total);
                        self.usage.final_split(split);
                    } else {
                        let index = choices
                            .and_then(|c| c.first())
                            .and_then(|c| c.get("index"))
                            .and_then(Value::as_u64)
                            .unwrap_or(0) as usize;
                        self.usage.sample(index, total);
                        self.usage.sample_split(index, split);
                    }
                }
                Some((usage.is_some(), no_choices))
            }
        }
    }
}
