//! Active health checks (a GET of each worker's health path on `[health] interval`) and the
//! log line and metric of every health change, passive ejections included.

use std::sync::Arc;
use std::time::Duration;

use super::{discover_worker, Discovery, Ejection, Fleet, ProbeVerdict, Worker};
use crate::metrics;
use crate::upstream::{read_body, Upstream};

/// A health answer is read (and dropped) up to this size: `/v1/models` lists can be long.
const MAX_HEALTH_BYTES: usize = 1024 * 1024;

/// Probe every worker once, concurrently, each within `timeout`.
pub async fn check_all(fleet: &Fleet, upstream: &Upstream, timeout: Duration) {
    let probes = fleet
        .workers()
        .map(|w| check_worker(w.clone(), upstream, timeout));
    futures_util::future::join_all(probes).await;
}

async fn check_worker(worker: Arc<Worker>, upstream: &Upstream, timeout: Duration) {
    let result = probe(&worker, upstream, timeout).await;
    ::metrics::counter!(
        metrics::HEALTH_PROBES_TOTAL,
        "pool" => worker.pool.to_string(),
        "role" => worker.role.as_str(),
        "worker" => worker.authority.clone(),
        "result" => if result.is_ok() { "ok" } else { "failed" }
    )
    .increment(1);
    let error = result.as_ref().err().cloned();
    match worker.health().probe(result) {
        ProbeVerdict::Steady => {}
        ProbeVerdict::WentDown => {
            // Its engine may restart without its cache: the prefix index forgets it.
            worker.left_service();
            tracing::warn!(
                pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                path = worker.health_path(), error = ?error,
                "worker failed its health checks: no new requests until it recovers"
            );
            worker.publish_gauges();
        }
        ProbeVerdict::Recovering => {
            // An engine that restarted may have come back with another KV pool: its
            // capacity is asked again before it serves (I3).
            discover_worker(worker.clone(), upstream.clone()).await;
            // Back when its capacity is known: discovered now, or configured for an engine
            // that offers no discovery (an OpenAI-style server answering 404 there).
            if matches!(worker.discovery(), Discovery::Found(_)) || worker.kv_tokens().is_some() {
                worker.health().mark_up();
                tracing::info!(
                    pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                    kv_tokens = ?worker.kv_tokens(),
                    "worker passes its health checks again and its capacity was rediscovered: back in service"
                );
                worker.publish_gauges();
            } else {
                tracing::warn!(
                    pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
                    "worker passes its health checks but its capacity could not be discovered; it stays out"
                );
            }
        }
    }
}

async fn probe(worker: &Worker, upstream: &Upstream, timeout: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + timeout;
    let path = worker.health_path();
    let response = upstream
        .get(worker, path, deadline)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    read_body(
        worker,
        response.into_body(),
        MAX_HEALTH_BYTES,
        deadline,
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("GET {path} answered {status}"))
    }
}

/// Log and count an ejection `worker` just had (passive outlier detection).
pub fn report_ejection(worker: &Worker, ejection: &Ejection) {
    ::metrics::counter!(
        metrics::WORKER_EJECTIONS_TOTAL,
        "pool" => worker.pool.to_string(),
        "role" => worker.role.as_str(),
        "worker" => worker.authority.clone(),
        "cause" => ejection.cause
    )
    .increment(1);
    tracing::warn!(
        pool = %worker.pool, role = worker.role.as_str(), worker = %worker.authority,
        cause = ejection.cause, ejections_in_a_row = ejection.count,
        seconds = ejection.duration.as_secs_f64(), after_trial = ejection.after_trial,
        "worker ejected: its requests keep failing"
    );
    worker.publish_gauges();
}
