//! Asking each engine for its load on the health interval: SGLang pools `GET /v1/loads`,
//! OpenAI-style pools (vLLM) `GET /metrics` in Prometheus text. An engine that answers
//! neither (a 404, an unreadable body, llama.cpp) has no report, and only kvgate's own
//! account of the KV it holds there counts (see [`super::load`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::load::{parse_sglang_loads, parse_vllm_metrics, EngineLoad, Reported};
use super::{Fleet, Worker};
use crate::config::EngineKind;
use crate::upstream::{read_body, Upstream};

/// A load answer is read up to this size (vLLM's `/metrics` carries histograms too).
const MAX_LOAD_BYTES: usize = 4 * 1024 * 1024;

/// Ask every worker of `fleet` for its load once, concurrently, each within `timeout`, and
/// record what each said (or that it said nothing usable).
pub async fn poll_loads(fleet: &Fleet, upstream: &Upstream, timeout: Duration) {
    let polls = fleet.pools().iter().flat_map(|pool| {
        let engine = pool.engine;
        pool.all_workers()
            .map(move |w| poll_worker(w.clone(), engine, upstream, timeout))
    });
    futures_util::future::join_all(polls).await;
}

async fn poll_worker(
    worker: Arc<Worker>,
    engine: EngineKind,
    upstream: &Upstream,
    timeout: Duration,
) {
    // Requests that end while the report travels were kvgate's: the larger of the counts
    // before and after is kvgate's share of what the engine reports.
    let before = worker.outstanding();
    let report = match ask(&worker, engine, upstream, timeout).await {
        Ok(reported) => {
            worker.set_reported_max_running(reported.max_running);
            Some(EngineLoad {
                // Set when the report is recorded, against kvgate's outstanding requests then.
                foreign_requests: 0,
                running: reported.running,
                waiting: reported.waiting,
                used_kv_tokens: reported.used_tokens.or_else(|| {
                    // vLLM reports a fraction of its own pool: the discovered size when known,
                    // else the enforced one.
                    let usage = reported.usage?;
                    let pool = worker.kv_tokens()?;
                    Some((usage * pool as f64).round() as u64)
                }),
                // Set when the report is recorded, against kvgate's account then.
                foreign_kv_tokens: None,
                at: Instant::now(),
            })
        }
        Err(why) => {
            worker.set_reported_max_running(None);
            // Many engines have no load endpoint: not worth more than a debug line.
            tracing::debug!(
                pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                why, "no load report from the engine; only kvgate's own account counts"
            );
            None
        }
    };
    worker.set_engine_load(report, before);
}

async fn ask(
    worker: &Worker,
    engine: EngineKind,
    upstream: &Upstream,
    timeout: Duration,
) -> Result<Reported, String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let path = match engine {
        EngineKind::Sglang => "/v1/loads",
        EngineKind::Openai => "/metrics",
    };
    let response = upstream
        .get(worker, path, deadline)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = read_body(worker, response.into_body(), MAX_LOAD_BYTES, deadline, None)
        .await
        .map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("GET {path} answered {status}"));
    }
    let parsed = match engine {
        EngineKind::Sglang => parse_sglang_loads(&body),
        EngineKind::Openai => std::str::from_utf8(&body).ok().and_then(parse_vllm_metrics),
    };
    parsed.ok_or_else(|| format!("GET {path}: no load fields in the answer"))
}
