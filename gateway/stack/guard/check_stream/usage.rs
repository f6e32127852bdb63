//! Usage in a guarded stream: what the engine reported (rate-limit settlement), and the
//! usage the gateway asked for on the client's behalf, stripped again.

use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;

use crate::accounting::TokenUsage;

use crate::stack::guard::sse::SseEvent;
use crate::stack::guard::strip_key::without_top_level_key;

/// What the client asked for that the gateway changed to be able to check the stream.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageRewrite {
    /// The client did not ask for the final usage chunk: drop it.
    pub strip_final_usage: bool,
    /// The client did not ask for usage in every chunk: remove it from chunks.
    pub strip_chunk_usage: bool,
}

/// The engine's usage as last reported: per sample, and a final total; the same again
/// split into prompt, completion and cached tokens (the tenant's account).
#[derive(Debug, Default)]
pub(super) struct EngineUsage {
    per_sample: BTreeMap<usize, u64>,
    final_total: Option<u64>,
    split_per_sample: BTreeMap<usize, TokenUsage>,
    split_final: Option<TokenUsage>,
}

impl EngineUsage {
    /// Sample `index` has used `total` tokens so far.
    pub(super) fn sample(&mut self, index: usize, total: u64) {
        self.per_sample.insert(index, total);
    }

    /// The stream's final total.
    pub(super) fn final_total(&mut self, total: u64) {
        self.final_total = Some(total);
    }

    /// Sample `index` has used `usage` so far (a cumulative report replaces the last).
    pub(super) fn sample_split(&mut self, index: usize, usage: TokenUsage) {
        self.split_per_sample.insert(index, usage);
    }

    /// The stream's final usage.
    pub(super) fn final_split(&mut self, usage: TokenUsage) {
        self.split_final = Some(usage);
    }

    /// The engine's reported usage, split: the final report, else the samples' last ones
    /// summed.
    pub(super) fn split(&self) -> Option<TokenUsage> {
        self.split_final.or_else(|| {
            self.split_per_sample
                .values()
                .copied()
                .reduce(TokenUsage::plus)
        })
    }

    /// The engine's reported usage (prompt + completion tokens).
    pub(super) fn total(&self) -> Option<u64> {
        self.final_total
            .or_else(|| (!self.per_sample.is_empty()).then(|| self.per_sample.values().sum()))
    }
}

/// Takes out of the client's events the usage it did not ask for.
#[derive(Debug)]
pub(super) struct UsageStrip {
    rewrite: UsageRewrite,
    /// A chunk with choices carried usage before (the engine honours `continuous_usage_stats`
    /// and sends its final usage in a chunk of its own).
    chunk_usage_seen: bool,
}

impl UsageStrip {
    pub(super) fn new(rewrite: UsageRewrite) -> Self {
        Self {
            rewrite,
            chunk_usage_seen: false,
        }
    }

    /// What goes out for an OpenAI event that carries usage: as received, without the
    /// usage the client did not ask for, or nothing. `all_finished`: every sample had its
    /// final `finish_reason`. `tree` is the event's parsed JSON when the checks built it
    /// (the typed view does not; it is parsed here in the rare case the text cut declines).
    ///
    /// An engine that ignores `continuous_usage_stats` and puts its only usage on the chunk
    /// that finishes the stream (llama.cpp's `/v1/completions`) sends there the final usage a
    /// client asked for with `include_usage`: that usage is kept.
    pub(super) fn apply(
        &mut self,
        event: &SseEvent,
        no_choices: bool,
        all_finished: bool,
        tree: Option<&mut Value>,
    ) -> Option<Bytes> {
        if no_choices && self.rewrite.strip_final_usage {
            return None;
        }
        if !no_choices && self.rewrite.strip_chunk_usage {
            let only_usage_at_the_end = !self.chunk_usage_seen && all_finished;
            self.chunk_usage_seen = true;
            if only_usage_at_the_end && !self.rewrite.strip_final_usage {
                return Some(event.raw.clone());
            }
            // Cut from the engine's text; re-serialise only what the scanner declines.
            let stripped = event
                .data
                .as_deref()
                .and_then(|d| without_top_level_key(d, "usage"));
            if let Some(stripped) = stripped {
                return Some(SseEvent::data_event(&stripped));
            }
            let mut parsed = None;
            let value = match tree {
                Some(value) => value,
                None => match event.json() {
                    Some(value) => parsed.insert(value),
                    // Not reached: the typed view only reads JSON objects.
                    None => return Some(event.raw.clone()),
                },
            };
            if let Some(map) = value.as_object_mut() {
                map.remove("usage");
            }
            return Some(SseEvent::data_event(&value.to_string()));
        }
        Some(event.raw.clone())
    }
}
