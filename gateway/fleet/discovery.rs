//! Capacity, version and cache-tier discovery: ask each engine for its KV pool, version and
//! the cache tiers below its GPU prefix cache (`/get_server_info`, newer SGLang
//! `/server_info`; `/version` where that is all there is, as on vLLM; llama.cpp's `/props`,
//! which answers none of those) at start-up and on an interval.

use http::StatusCode;
use serde_json::Value;
use std::sync::Arc;

use super::{parse_reported, Discovery, Fleet, ServerInfo, Worker};
use crate::upstream::{read_body, Upstream};

// `/props` last: llama.cpp answers 404 to the others, and its `/props` is what it says of
// itself (its `n_ctx` is not read as capacity: `kv_tokens` stays configured there).
const INFO_PATHS: [&str; 4] = ["/get_server_info", "/server_info", "/version", "/props"];
const MAX_INFO_BYTES: usize = 4 * 1024 * 1024;

/// Probe every worker once, concurrently.
pub async fn discover_all(fleet: &Fleet, upstream: &Upstream) {
    let probes = fleet
        .workers()
        .map(|w| discover_worker(w.clone(), upstream.clone()));
    futures_util::future::join_all(probes).await;
}

/// Probe one worker and record what it reported.
pub async fn discover_worker(worker: Arc<Worker>, upstream: Upstream) {
    let result = probe(&worker, &upstream).await;
    let changed = match (&worker.discovery(), &result) {
        (Discovery::Found(a), Discovery::Found(b)) => a != b,
        (Discovery::Failed(_), Discovery::Failed(_)) => false,
        _ => true,
    };
    if changed {
        match &result {
            Discovery::Found(info) => tracing::info!(
                pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                kv_tokens = ?info.max_total_num_tokens, max_req_input_len = ?info.max_req_input_len,
                context_length = ?info.context_length, version = ?info.version,
                "discovered worker capacity"
            ),
            Discovery::Failed(e) => tracing::warn!(
                pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                error = %e, "worker discovery failed"
            ),
            Discovery::Pending => {}
        }
    }
    worker.set_discovery(result);
    if changed {
        report_cache_tiers(&worker);
    }
    if let Some((configured, discovered)) = worker.capacity_mismatch() {
        if changed {
            tracing::warn!(
                pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                configured, discovered, enforced = configured.min(discovered),
                "configured kv_tokens disagrees with the engine; enforcing the smaller"
            );
        }
    }
}

/// Say what the worker's cache tiers are when they keep it from serving, or when the pool's
/// `cache_tiers` and the engine's report disagree (issue 40).
fn report_cache_tiers(worker: &Worker) {
    let (_, disagreement) = worker.cache_tiers();
    if let Some(d) = disagreement {
        tracing::warn!(
            pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
            "{d}"
        );
    }
    if let Some(why) = worker.cache_tier_refusal() {
        tracing::warn!(
            pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
            "worker refused: {why}"
        );
    }
}

async fn probe(worker: &Worker, upstream: &Upstream) -> Discovery {
    let mut last_error = String::from("no answer");
    for path in INFO_PATHS {
        let deadline = upstream
            .deadline()
            .min(tokio::time::Instant::now() + std::time::Duration::from_secs(10));
        let response = match upstream.get(worker, path, deadline).await {
            Ok(r) => r,
            Err(e) => return Discovery::Failed(e.to_string()),
        };
        let status = response.status();
        let body =
            match read_body(worker, response.into_body(), MAX_INFO_BYTES, deadline, None).await {
                Ok(b) => b,
                Err(e) => return Discovery::Failed(e.to_string()),
            };
        if status == StatusCode::NOT_FOUND {
            last_error = format!("{path} answered 404");
            continue;
        }
        if !status.is_success() {
            return Discovery::Failed(format!("{path} answered {status}"));
        }
        // `/version` answers only {"version": ...}: capacity must then be configured.
        return match serde_json::from_slice::<Value>(&body) {
            Ok(v) => Discovery::Found(parse_server_info(&v)),
            Err(e) => Discovery::Failed(format!("{path} is not JSON: {e}")),
        };
    }
    Discovery::Failed(last_error)
}

/// Read the capacity fields out of a server-info document. SGLang has moved them between
/// releases (`scheduler_info`, `internal_states[0]`, top level); look in each.
pub fn parse_server_info(v: &Value) -> ServerInfo {
    let scopes: Vec<&Value> = [
        v.get("scheduler_info"),
        v.get("internal_states").and_then(|s| s.get(0)),
        Some(v),
    ]
    .into_iter()
    .flatten()
    .collect();
    let find_u64 = |key: &str| {
        scopes
            .iter()
            .find_map(|s| s.get(key).and_then(Value::as_u64))
    };
    ServerInfo {
        max_total_num_tokens: find_u64("max_total_num_tokens"),
        max_req_input_len: find_u64("max_req_input_len"),
        context_length: find_u64("context_length"),
        max_running_requests: effective_max_running(v).or_else(|| find_u64("max_running_requests")),
        bootstrap_port: find_u64("disaggregation_bootstrap_port")
            .and_then(|p| u16::try_from(p).ok()),
        disaggregation_mode: v
            .get("disaggregation_mode")
            .and_then(Value::as_str)
            .map(str::to_owned),
        version: v.get("version").and_then(Value::as_str).map(str::to_owned),
        cache_tiers: parse_reported(v),
    }
}

/// The requests the engine runs at once, as its schedulers computed it: SGLang's
/// `internal_states[i].effective_max_running_requests_per_dp`, one per data-parallel rank,
/// summed (`Scheduler.get_internal_state`, read at sgl-project/sglang 025177e4; the
/// top-level `max_running_requests` is the flag as given, `null` when unset).
fn effective_max_running(v: &Value) -> Option<u64> {
    let ranks = v.get("internal_states")?.as_array()?;
    ranks
        .iter()
        .map(|r| r.get("effective_max_running_requests_per_dp")?.as_u64())
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_capacity_from_scheduler_info_or_top_level() {
        let info = parse_server_info(&json!({
            "context_length": 1048576,
            "disaggregation_mode": "prefill",
            "disaggregation_bootstrap_port": 8998,
            "scheduler_info": {"max_total_num_tokens": 681280, "max_req_input_len": 681274},
            "version": "0.5.21"
        }));
        assert_eq!(info.max_total_num_tokens, Some(681280));
        assert_eq!(info.max_req_input_len, Some(681274));
        assert_eq!(info.context_length, Some(1048576));
        assert_eq!(info.bootstrap_port, Some(8998));
        assert_eq!(info.max_running_requests, None);
        let ranks = parse_server_info(&json!({
            "max_running_requests": null,
            "internal_states": [{"effective_max_running_requests_per_dp": 48},
                                {"effective_max_running_requests_per_dp": 48}]
        }));
        assert_eq!(ranks.max_running_requests, Some(96), "summed over DP ranks");
        let flag = parse_server_info(&json!({"max_running_requests": 16}));
        assert_eq!(flag.max_running_requests, Some(16));
        let older = parse_server_info(&json!({"max_total_num_tokens": 5}));
        assert_eq!(older.max_total_num_tokens, Some(5));
        assert_eq!(older.bootstrap_port, None);
    }
}
