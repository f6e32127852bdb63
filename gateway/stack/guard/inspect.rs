//! What makes an engine's answer a false success, read from its JSON.
//!
//! Pure functions over `serde_json::Value`, shared by the non-streaming check, the stream
//! check and the prefill leg of PD requests. SGLang native answers carry
//! `meta_info.finish_reason` objects and `meta_info.prompt_tokens`; OpenAI answers carry
//! `choices[].finish_reason` strings and `usage.prompt_tokens`.

use regex::Regex;
use serde_json::Value;
use std::sync::Arc;

use crate::config::GuardConfig;

mod answer;
mod pooling;
pub(super) mod typed;

pub use answer::{check_answer, Answer};
pub use pooling::{check_pooling, pooling_usage, PoolingShape};

/// Which response shapes to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// SGLang `/generate`.
    Native,
    /// OpenAI chat and completions.
    OpenAi,
}

impl Shape {
    /// Whether `event` (a stream event's JSON object) is a chunk of this protocol: SGLang
    /// native chunks carry `text` or `meta_info`; OpenAI chunks `choices` or `usage`.
    pub fn is_event(self, event: &serde_json::Value) -> bool {
        let has = |k: &str| event.get(k).is_some_and(|v| !v.is_null());
        match self {
            Shape::Native => has("text") || has("meta_info"),
            Shape::OpenAi => has("choices") || has("usage"),
        }
    }
}

/// Why the guard stopped an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trip {
    /// The engine marked the request aborted (`finish_reason` abort), with its status if any.
    Aborted {
        status: Option<u16>,
        message: String,
    },
    /// An error object inside a 2xx answer.
    ErrorIn2xx {
        status: Option<u16>,
        message: String,
    },
    /// No result where one must be.
    EmptyResult { detail: &'static str },
    /// A configured placeholder marker matched the generated text.
    PlaceholderMarker,
    /// The engine counted a different prompt than the gateway did.
    PromptTokens {
        sample: usize,
        expected: u64,
        reported: u64,
    },
    /// A stream ended without a final `finish_reason` and `[DONE]`.
    Truncated { detail: &'static str },
    /// The answer holds fragments of other tenants' recent prompts (leak detector, block).
    LeakSuspected { owners: usize },
    /// A stream event is not the engine's protocol (not JSON, or the wrong shape).
    Unparsable { detail: &'static str },
    /// The engine's stream went silent past `upstream.stream_idle_timeout`, or ran past
    /// `upstream.request_timeout`.
    Stalled { timeout: std::time::Duration },
}

impl Trip {
    /// The `reason` metric label and audit field.
    pub fn reason(&self) -> &'static str {
        match self {
            Trip::Aborted { .. } => "abort",
            Trip::ErrorIn2xx { .. } => "error_in_success",
            Trip::EmptyResult { .. } => "empty_result",
            Trip::PlaceholderMarker => "placeholder_marker",
            Trip::PromptTokens { .. } => "prompt_tokens_mismatch",
            Trip::Truncated { .. } => "stream_truncated",
            Trip::LeakSuspected { .. } => "leak_suspected",
            Trip::Unparsable { .. } => "unparsable_event",
            Trip::Stalled { .. } => "stream_stalled",
        }
    }
}

/// Placeholder markers of a pool.
#[derive(Debug, Clone, Default)]
pub struct Markers {
    literals: Arc<[String]>,
    patterns: Arc<[Regex]>,
    /// Bytes of earlier text kept so a marker split across stream events is still found.
    overlap: usize,
}

impl Markers {
    /// Compile a pool's markers (patterns were validated at config load).
    pub fn from_config(config: &GuardConfig) -> Self {
        let patterns: Vec<Regex> = config
            .marker_patterns
            .iter()
            .filter_map(|p| Regex::new(p).ok())
            .collect();
        let longest = config.markers.iter().map(String::len).max().unwrap_or(0);
        Self {
            literals: config.markers.clone().into(),
            // Patterns have no length bound; 256 bytes of context covers realistic markers.
            overlap: if patterns.is_empty() {
                longest
            } else {
                longest.max(256)
            },
            patterns: patterns.into(),
        }
    }

    /// Whether no marker is configured.
    pub fn is_empty(&self) -> bool {
        self.literals.is_empty() && self.patterns.is_empty()
    }

    /// Whether `text` holds a marker.
    pub fn matches(&self, text: &str) -> bool {
        self.literals.iter().any(|m| text.contains(m.as_str()))
            || self.patterns.iter().any(|p| p.is_match(text))
    }

    /// Bytes of preceding text to keep when scanning text piece by piece.
    pub fn overlap(&self) -> usize {
        self.overlap
    }
}

/// What the gateway expects of an answer.
#[derive(Debug, Clone)]
pub struct Expectation {
    /// kvgate's exact prompt count per sample, when known.
    pub prompt_tokens: Option<Arc<[u64]>>,
    /// Allowed difference (0 for token-id prompts).
    pub tolerance: u64,
}

impl Expectation {
    /// Compare the engine's count for `sample` (or the total over all samples when `sample`
    /// is None) with the gateway's.
    pub fn check_prompt_tokens(
        &self,
        sample: Option<usize>,
        reported: Option<u64>,
    ) -> Result<(), Trip> {
        let (Some(expected), Some(reported)) = (&self.prompt_tokens, reported) else {
            return Ok(());
        };
        let expected = match sample {
            Some(i) => match expected.get(i) {
                Some(n) => *n,
                None => return Ok(()),
            },
            None => expected.iter().sum(),
        };
        if expected.abs_diff(reported) > self.tolerance {
            return Err(Trip::PromptTokens {
                sample: sample.unwrap_or(0),
                expected,
                reported,
            });
        }
        Ok(())
    }
}

fn status_of(v: &Value) -> Option<u16> {
    v.as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (100..600).contains(s))
}

fn message_of(v: &Value) -> String {
    v.get("message")
        .and_then(Value::as_str)
        .or_else(|| v.as_str())
        .unwrap_or("the engine reported an error")
        .chars()
        .take(1000)
        .collect()
}

/// An `error` object (or SGLang's `"object": "error"`) inside a 2xx answer or event.
pub fn error_object(v: &Value) -> Option<Trip> {
    if let Some(e) = v.get("error").filter(|e| !e.is_null()) {
        let status = e
            .get("code")
            .and_then(status_of)
            .or_else(|| v.get("status_code").and_then(status_of));
        return Some(Trip::ErrorIn2xx {
            status,
            message: message_of(e),
        });
    }
    if v.get("object").and_then(Value::as_str) == Some("error") {
        return Some(Trip::ErrorIn2xx {
            status: v.get("code").and_then(status_of),
            message: message_of(v),
        });
    }
    None
}

/// A native `finish_reason` object: abort → trip; Ok(true) when it is a final reason.
pub fn native_finish(finish: &Value) -> Result<bool, Trip> {
    match finish.get("type").and_then(Value::as_str) {
        Some("abort") => Err(Trip::Aborted {
            status: finish.get("status_code").and_then(status_of),
            message: message_of(finish),
        }),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// An OpenAI `finish_reason` string: abort/error → trip; Ok(true) when final.
pub fn openai_finish(choice: &Value) -> Result<bool, Trip> {
    openai_finish_reason(choice.get("finish_reason").and_then(Value::as_str))
}

/// [`openai_finish`] of a `finish_reason` already read as a string (or not one).
pub(super) fn openai_finish_reason(reason: Option<&str>) -> Result<bool, Trip> {
    match reason {
        Some(reason @ ("abort" | "error")) => Err(Trip::Aborted {
            status: None,
            message: format!("the engine ended the generation with finish_reason \"{reason}\""),
        }),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

fn check_native_item(
    item: &Value,
    index: usize,
    markers: &Markers,
    expect: &Expectation,
) -> Result<(), Trip> {
    if let Some(trip) = error_object(item) {
        return Err(trip);
    }
    let (Some(text), Some(meta)) = (item.get("text"), item.get("meta_info")) else {
        return Err(Trip::EmptyResult {
            detail: "the answer has no text or meta_info",
        });
    };
    if !native_finish(meta.get("finish_reason").unwrap_or(&Value::Null))? {
        return Err(Trip::EmptyResult {
            detail: "the answer has no finish_reason",
        });
    }
    expect.check_prompt_tokens(
        Some(index),
        meta.get("prompt_tokens").and_then(Value::as_u64),
    )?;
    if text.as_str().is_some_and(|t| markers.matches(t)) {
        return Err(Trip::PlaceholderMarker);
    }
    Ok(())
}

fn check_openai(v: &Value, markers: &Markers, expect: &Expectation) -> Result<(), Trip> {
    let choices = v.get("choices").and_then(Value::as_array);
    let choices = choices.map(|c| {
        c.iter().map(|choice| {
            let reason = choice.get("finish_reason").and_then(Value::as_str);
            let text = choice
                .get("message")
                .and_then(|x| x.get("content"))
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str);
            (reason, text)
        })
    });
    let prompt_tokens = v
        .get("usage")
        .and_then(|x| x.get("prompt_tokens"))
        .and_then(Value::as_u64);
    check_openai_parts(choices, prompt_tokens, markers, expect)
}

/// The OpenAI checks over what they read, however it was read (tree or typed view):
/// each choice's `finish_reason` and text, and `usage.prompt_tokens`.
fn check_openai_parts<'t>(
    choices: Option<impl ExactSizeIterator<Item = (Option<&'t str>, Option<&'t str>)>>,
    prompt_tokens: Option<u64>,
    markers: &Markers,
    expect: &Expectation,
) -> Result<(), Trip> {
    let Some(choices) = choices.filter(|c| c.len() > 0) else {
        return Err(Trip::EmptyResult {
            detail: "the answer has no choices",
        });
    };
    for (reason, text) in choices {
        if !openai_finish_reason(reason)? {
            return Err(Trip::EmptyResult {
                detail: "a choice has no finish_reason",
            });
        }
        if text.is_some_and(|t| markers.matches(t)) {
            return Err(Trip::PlaceholderMarker);
        }
    }
    expect.check_prompt_tokens(None, prompt_tokens)
}

/// Check the prefill leg of a PD request: its body, a JSON answer or an SSE stream read to
/// its end. Only aborts, errors and the prompt count matter here (prefill generates nothing).
pub fn check_prefill(shape: Shape, body: &[u8], expect: &Expectation) -> Result<(), Trip> {
    let trimmed = body.trim_ascii_start();
    let values: Vec<Value> = if trimmed.starts_with(b"data:") || trimmed.starts_with(b":") {
        String::from_utf8_lossy(trimmed)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => items,
            Ok(v) => vec![v],
            Err(_) => {
                return Err(Trip::EmptyResult {
                    detail: "the prefill answer is not JSON",
                })
            }
        }
    };
    for (position, v) in values.iter().enumerate() {
        if let Some(trip) = error_object(v) {
            return Err(trip);
        }
        let index = v
            .get("index")
            .and_then(Value::as_u64)
            .map_or(position, |i| i as usize);
        match shape {
            Shape::Native => {
                if let Some(meta) = v.get("meta_info") {
                    native_finish(meta.get("finish_reason").unwrap_or(&Value::Null))?;
                    expect.check_prompt_tokens(
                        Some(index),
                        meta.get("prompt_tokens").and_then(Value::as_u64),
                    )?;
                }
            }
            Shape::OpenAi => {
                for choice in v
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    openai_finish(choice)?;
                }
                expect.check_prompt_tokens(
                    None,
                    v.get("usage")
                        .and_then(|x| x.get("prompt_tokens"))
                        .and_then(Value::as_u64),
                )?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
