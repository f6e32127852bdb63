//! The engine's reported usage of one request, split as the tenant counters count it.

use serde_json::Value;

/// Prompt, completion and cached prompt tokens, as the engine reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt: u64,
    pub completion: u64,
    /// Prompt tokens the engine found in its prefix cache (a part of `prompt`).
    pub cached: u64,
}

impl TokenUsage {
    /// From a `usage` object: OpenAI's (`prompt_tokens`, `completion_tokens`,
    /// `prompt_tokens_details.cached_tokens`), the Responses API's (`input_tokens`,
    /// `output_tokens`, `input_tokens_details.cached_tokens`) or Anthropic's
    /// (`input_tokens`, `output_tokens`, `cache_read_input_tokens`). `None` without a prompt
    /// or completion count.
    pub fn from_usage(usage: &Value) -> Option<Self> {
        let n = |key: &str| usage.get(key).and_then(Value::as_u64);
        // Anthropic's `input_tokens` leaves out what was read from or written to the cache:
        // the whole prompt is their sum.
        let anthropic_cache = ["cache_read_input_tokens", "cache_creation_input_tokens"]
            .iter()
            .filter_map(|k| n(*k))
            .sum::<u64>();
        let prompt = n("prompt_tokens")
            .or_else(|| n("input_tokens").map(|i| i.saturating_add(anthropic_cache)));
        let completion = n("completion_tokens").or_else(|| n("output_tokens"));
        if prompt.is_none() && completion.is_none() {
            return None;
        }
        let cached = ["prompt_tokens_details", "input_tokens_details"]
            .iter()
            .find_map(|k| usage.get(*k)?.get("cached_tokens")?.as_u64())
            .or_else(|| n("cache_read_input_tokens"))
            .unwrap_or(0);
        Some(Self {
            prompt: prompt.unwrap_or(0),
            completion: completion.unwrap_or(0),
            cached,
        })
    }

    /// From SGLang's native `meta_info` (`prompt_tokens`, `completion_tokens`,
    /// `cached_tokens`).
    pub fn from_meta(meta: &Value) -> Option<Self> {
        let n = |key: &str| meta.get(key).and_then(Value::as_u64);
        if n("prompt_tokens").is_none() && n("completion_tokens").is_none() {
            return None;
        }
        Some(Self {
            prompt: n("prompt_tokens").unwrap_or(0),
            completion: n("completion_tokens").unwrap_or(0),
            cached: n("cached_tokens").unwrap_or(0),
        })
    }

    /// The usage of a whole answer: its `usage` object, else (native) the sum of its
    /// items' `meta_info`.
    pub fn from_answer(answer: &Value) -> Option<Self> {
        if let Some(usage) = answer.get("usage").and_then(|u| Self::from_usage(u)) {
            return Some(usage);
        }
        match answer {
            Value::Array(items) => items
                .iter()
                .filter_map(|i| Self::from_meta(i.get("meta_info")?))
                .reduce(|a, b| a.plus(b)),
            other => Self::from_meta(other.get("meta_info")?),
        }
    }

    /// Both usages together.
    pub fn plus(self, other: Self) -> Self {
        Self {
            prompt: self.prompt.saturating_add(other.prompt),
            completion: self.completion.saturating_add(other.completion),
            cached: self.cached.saturating_add(other.cached),
        }
    }
}
