//! `GET /metrics`: the scheduler's gauges and the prompt-token counters in Prometheus text
//! format, with SGLang's names.
//!
//! Gauge names, help texts and labels are SGLang's `SchedulerMetricsCollector`'s
//! (`python/sglang/srt/metrics/collector.py`): `model_name` (the served model name),
//! `engine_type` (`unified`, `prefill` or `decode`), `tp_rank` and `pp_rank` (0 here, one
//! rank). The counters are its `TokenizerMetricsCollector`'s, labelled `model_name` only,
//! written as prometheus_client writes a counter in the text format (`# TYPE x_total
//! counter`; the optional `x_created` sample is left out). Values are written as floats, as
//! Python's prometheus_client writes them. The sim has no vLLM mode, so vLLM's names
//! (`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
//! `vllm:prefix_cache_hits_total`) are not served.
//!
//! The counters count the prefills this engine ran (unified and prefill roles), so summing
//! them over a fleet counts each prompt once: a decode counts none, where SGLang's decode
//! also counts the requests it answers. `sglang:cache_hit_rate` is the counters' ratio
//! since start-up; SGLang's is that of the latest prefill batches.

use std::fmt::Write;

use super::config::SimRole;
use super::engine::SimEngine;
use super::load::{token_usage, used_tokens};

/// Running requests (gauge).
pub(crate) const NUM_RUNNING_REQS: &str = "sglang:num_running_reqs";
/// Waiting requests (gauge).
pub(crate) const NUM_QUEUE_REQS: &str = "sglang:num_queue_reqs";
/// KV tokens in use (gauge).
pub(crate) const NUM_USED_TOKENS: &str = "sglang:num_used_tokens";
/// KV tokens in use over the pool (gauge, 0 to 1).
pub(crate) const TOKEN_USAGE: &str = "sglang:token_usage";
/// The pool's size in tokens (gauge).
pub(crate) const MAX_TOTAL_NUM_TOKENS: &str = "sglang:max_total_num_tokens";
/// Cached over prompt tokens (gauge, 0 to 1).
pub(crate) const CACHE_HIT_RATE: &str = "sglang:cache_hit_rate";
/// Prompt tokens of the prefills run (counter).
pub(crate) const PROMPT_TOKENS_TOTAL: &str = "sglang:prompt_tokens_total";
/// Of those, tokens found in the prefix cache (counter).
pub(crate) const CACHED_TOKENS_TOTAL: &str = "sglang:cached_tokens_total";

/// The text body of `/metrics`.
pub(crate) fn render(engine: &SimEngine) -> String {
    let c = &engine.config;
    let load = engine.scheduler.load();
    let stats = engine.stats.snapshot();
    let hit_rate = if stats.prompt_tokens == 0 {
        0.0
    } else {
        stats.cached_tokens as f64 / stats.prompt_tokens as f64
    };
    let engine_type = match c.role {
        SimRole::Unified => "unified",
        SimRole::Prefill => "prefill",
        SimRole::Decode => "decode",
    };
    let labels = format!(
        "model_name=\"{}\",engine_type=\"{engine_type}\",tp_rank=\"0\",pp_rank=\"0\"",
        escape(&c.model)
    );
    let gauges = [
        (
            NUM_RUNNING_REQS,
            "The number of running requests.",
            load.running as f64,
        ),
        (
            NUM_QUEUE_REQS,
            "The number of requests in the waiting queue.",
            load.waiting as f64,
        ),
        (
            NUM_USED_TOKENS,
            "The number of used tokens.",
            used_tokens(engine, &load) as f64,
        ),
        (TOKEN_USAGE, "The token usage.", token_usage(engine, &load)),
        (
            MAX_TOTAL_NUM_TOKENS,
            "Maximum total number of tokens",
            c.kv_tokens as f64,
        ),
        (CACHE_HIT_RATE, "The prefix cache hit rate.", hit_rate),
    ];
    let counters = [
        (
            PROMPT_TOKENS_TOTAL,
            "Number of prefill tokens processed.",
            stats.prompt_tokens as f64,
        ),
        (
            CACHED_TOKENS_TOTAL,
            "Number of cached prompt tokens.",
            stats.cached_tokens as f64,
        ),
    ];
    let model_label = format!("model_name=\"{}\"", escape(&c.model));
    let mut out = String::new();
    // Writing to a String cannot fail.
    for (name, help, value) in gauges {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value:?}\n"
        );
    }
    for (name, help, value) in counters {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{model_label}}} {value:?}\n"
        );
    }
    out
}

/// A label value as the text format wants it: backslash, quote and newline escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape("qwen3"), "qwen3");
    }

    #[test]
    fn floats_are_written_as_python_writes_them() {
        assert_eq!(format!("{:?}", 3.0_f64), "3.0");
        assert_eq!(format!("{:?}", 0.25_f64), "0.25");
    }
}
