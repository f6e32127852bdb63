//! The admin API for engine pools and canary rollouts (on the admin port, every route
//! behind the admin token — rates say how much traffic each tenant-facing pool has):
//!
//! | route | what |
//! |---|---|
//! | `GET /pools` | pools and workers: capacity, version, eligibility, weight, live rates, the pool's gateway queue and prefix index, the DNS names that list its workers |
//! | `POST /pools/{pool}/weight` `{"weight": N}` | set a pool's traffic weight |
//! | `POST /pools/{pool}/workers/{host:port}/drain` | no new requests; in-flight ones finish |
//! | `POST /pools/{pool}/workers/{host:port}/undrain` | take requests again |
//! | `GET /rollouts` | every rollout: phase, weights, both pools' rates, the last decision |
//! | `POST /rollouts/{model}/rollback` `{"reason": "..."}` | roll the canary back now |
//! | `POST /rollouts/{model}/clear` | back to the configured weights, fresh canary window |
//! | `POST /rollouts/{model}/promote` | the next promotion step (all traffic without steps) |
//!
//! Changes apply to this replica at once and survive `POST /reload` (for pools whose entry
//! in the file is unchanged: the reload keeps them whole), not a restart: the config file stays the source of truth for weights. Rollout
//! decisions (rollback, clear, promote) are also shared with the other replicas through
//! Redis when `[limits]` uses it; plain weight and drain changes are per replica.

use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::Instant;

use crate::fleet::{Discovery, FairQueue, Fleet, Pool, Worker};
use crate::rollout::{rates_json, Rollouts};

/// An admin API answer: status and JSON body.
pub type Answer = (StatusCode, Value);

fn error(status: StatusCode, message: String, code: &str) -> Answer {
    (
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
    )
}

fn not_found(what: &str, name: &str) -> Answer {
    error(
        StatusCode::NOT_FOUND,
        format!("no {what} named `{name}`"),
        "not_found",
    )
}

/// Whether `path` is an admin API route (then [`handle`] answers it).
pub fn is_api_path(path: &str) -> bool {
    path == "/pools"
        || path == "/rollouts"
        || path.starts_with("/pools/")
        || path.starts_with("/rollouts/")
}

/// Answer one admin API request; `body` is the (bounded) request body.
pub fn handle(
    fleet: &Fleet,
    rollouts: &Rollouts,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Answer {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["pools"]) => (StatusCode::OK, pools(fleet)),
        (&Method::GET, ["rollouts"]) => {
            let now = Instant::now();
            let list: Vec<Value> = rollouts.all().iter().map(|r| r.report(now)).collect();
            (StatusCode::OK, json!({"rollouts": list}))
        }
        (&Method::POST, ["pools", pool, "weight"]) => {
            let Some(pool) = fleet.pool(pool) else {
                return not_found("pool", pool);
            };
            let weight = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v.get("weight").and_then(Value::as_u64))
                .and_then(|w| u32::try_from(w).ok());
            let Some(weight) = weight else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "send {\"weight\": N} with N a whole number ≥ 0".into(),
                    "invalid_request",
                );
            };
            pool.set_weight(weight);
            tracing::info!(pool = %pool.name, weight, "pool weight set through the admin API");
            (
                StatusCode::OK,
                pool_json(pool, Instant::now(), fleet.kv_overcommit()),
            )
        }
        (&Method::POST, ["pools", pool, "workers", worker, action @ ("drain" | "undrain")]) => {
            let Some(p) = fleet.pool(pool) else {
                return not_found("pool", pool);
            };
            let Some(w) = p.all_workers().find(|w| w.authority == *worker) else {
                return not_found(&format!("worker of pool `{pool}`"), worker);
            };
            w.set_draining(*action == "drain");
            tracing::info!(pool = %p.name, worker = %w.authority, action, "worker drain changed through the admin API");
            (
                StatusCode::OK,
                json!({"pool": &*p.name, "worker": w.authority, "draining": w.is_draining(), "outstanding": w.outstanding()}),
            )
        }
        (&Method::POST, ["rollouts", model, action @ ("rollback" | "clear" | "promote")]) => {
            let Some(rollout) = rollouts.of_model(model) else {
                return not_found("rollout for model", model);
            };
            match *action {
                "rollback" => {
                    let reason = serde_json::from_slice::<Value>(body)
                        .ok()
                        .and_then(|v| v.get("reason").and_then(Value::as_str).map(str::to_owned))
                        .unwrap_or_else(|| "rolled back by hand".into());
                    rollout.roll_back(&reason);
                }
                "clear" => rollout.clear(),
                _ => rollout.promote(),
            }
            (StatusCode::OK, rollout.report(Instant::now()))
        }
        (_, ["pools" | "rollouts", ..]) => error(
            StatusCode::NOT_FOUND,
            format!("no admin route {method} {path}; see GET /pools and GET /rollouts"),
            "not_found",
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            format!("no admin route {method} {path}"),
            "not_found",
        ),
    }
}

fn pools(fleet: &Fleet) -> Value {
    let now = Instant::now();
    let list: Vec<Value> = fleet
        .pools()
        .iter()
        .map(|p| {
            let mut pool = pool_json(p, now, fleet.kv_overcommit());
            pool["discovered_names"] = names_json(fleet, &p.name);
            pool
        })
        .collect();
    json!({"pools": list})
}

/// The DNS names that list a pool's workers (`discover`): per name its kind, the engines
/// of its last good answer, when that came, whether the latest resolution failed (`stale`:
/// the last answer is kept) and why.
pub fn names_json(fleet: &Fleet, pool: &str) -> Value {
    let now = std::time::SystemTime::now();
    let list: Vec<Value> = fleet
        .names()
        .of_pool(pool)
        .into_iter()
        .map(|(key, state)| {
            json!({
                "list": key.list,
                "name": key.name,
                "url": key.url,
                "discover": key.kind.as_str(),
                "engines": state.endpoints.iter().map(|e| e.addr.to_string()).collect::<Vec<_>>(),
                "stale": state.stale,
                "last_ok_seconds_ago": state.last_ok
                    .map(|t| now.duration_since(t).unwrap_or_default().as_secs_f64()),
                "last_error": state.last_error,
                "failures": state.failures,
            })
        })
        .collect();
    Value::Array(list)
}

/// One worker as the admin port shows it (`GET /pools`, `/ready` and `/status`).
pub fn worker_json(w: &Worker, overcommit: f64) -> Value {
    json!({
        "pool": &*w.pool,
        "role": w.role.as_str(),
        "worker": w.authority,
        "version": w.version(),
        "kv_tokens": w.kv_tokens(),
        "eligible": w.is_eligible(),
        "reason": w.ineligibility(),
        // Its cache tiers below the GPU prefix cache, each salted or not, and where that is
        // known from (issue 40): a tier that ignores the salt is the `reason` above.
        "cache_tiers": w.cache_tiers_json(),
        "draining": w.is_draining(),
        "outstanding": w.outstanding(),
        // The most requests its engine runs at once, and the KV share each then holds at
        // least in `kv_in_flight` (`fleet/worker/slots.rs`).
        "max_running": w.max_running(),
        "slot_tokens": w.slot_tokens(overcommit),
        "kv_in_flight": w.kv_in_flight(),
        "room": w.room(overcommit),
        "engine_load": w.engine_load().map(|l| json!({
            "running": l.running,
            "waiting": l.waiting,
            "used_kv_tokens": l.used_kv_tokens,
            "foreign_requests": l.foreign_requests,
            "age_seconds": l.at.elapsed().as_secs_f64(),
        })),
        "health": health_json(w),
        "discovery": match w.discovery() {
            Discovery::Pending => "pending".to_owned(),
            Discovery::Found(_) => "ok".to_owned(),
            Discovery::Failed(e) => e,
        },
    })
}

/// A worker's health: `state` and `cause` (the verdict), the passive side
/// (`consecutive_failures`: failed requests in a row, `ejections`) and the active probes of
/// its health `path` (`active_probe`; all zero and null while `[health] active = false`).
fn health_json(w: &Worker) -> Value {
    let h = w.health().snapshot(Instant::now());
    let seconds = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
    json!({
        "state": h.state,
        "consecutive_failures": h.consecutive_failures,
        "ejections": h.ejections,
        "ejected_for_seconds": seconds(h.ejected_for),
        "cause": h.cause,
        "path": w.health_path(),
        "active_probe": {
            "consecutive_failures": h.probe.consecutive_failures,
            "consecutive_passes": h.probe.consecutive_passes,
            "last_error": h.probe.last_error,
            "last_failed_seconds_ago": seconds(h.probe.last_failed_ago),
            "last_ok_seconds_ago": seconds(h.probe.last_ok_ago),
        },
    })
}

/// One pool and its workers as the admin port shows it (`GET /pools` and `/status`).
pub fn pool_json(pool: &Pool, now: Instant, overcommit: f64) -> Value {
    let workers: Vec<Value> = pool
        .all_workers()
        .map(|w| worker_json(w, overcommit))
        .collect();
    json!({
        "pool": &*pool.name,
        "model": pool.model,
        "version": pool.version,
        "weight": pool.weight(),
        "configured_weight": pool.configured_weight,
        "eligible": pool.ineligibility().is_none(),
        "reason": pool.ineligibility(),
        // It salts and more than one tenant may use it: its workers' cache tiers must honour
        // the salt (issue 40).
        "separates_tenants": pool.separates_tenants,
        "window_seconds": pool.signals.length().as_secs_f64(),
        "rates": rates_json(&pool.signals.rates(now)),
        "queue": queue_json(&pool.queue),
        "prefix_index": prefix_index_json(pool),
        "workers": workers,
    })
}

/// A pool's prefix index (`[prefix_routing]`): the blocks it remembers and its bound; null
/// for a pool with one unified or prefill worker (nothing to choose).
pub fn prefix_index_json(pool: &Pool) -> Value {
    let Some(index) = &pool.prefix else {
        return Value::Null;
    };
    // Workers that left service since the last request leave the index first.
    let workers: Vec<_> = pool
        .prefix_workers()
        .iter()
        .map(|w| w.prefix_candidate())
        .collect();
    index.sync(&workers);
    let size = index.size();
    json!({"blocks": size.blocks, "max_blocks": size.max_blocks})
}

/// A pool's gateway queue (issue 30): what waits, by class and by tenant, the oldest wait,
/// releases per second over the last 10 s and the `Retry-After` a refusal would carry now.
pub fn queue_json(queue: &FairQueue) -> Value {
    let snap = queue.snapshot();
    let by_class: serde_json::Map<String, Value> = snap
        .by_class
        .iter()
        .rev()
        .map(|(class, n)| (class.as_str().to_owned(), json!(n)))
        .collect();
    let by_tenant: serde_json::Map<String, Value> = snap
        .by_tenant
        .iter()
        .map(|(tenant, n)| (tenant.to_string(), json!(n)))
        .collect();
    json!({
        "length": snap.len,
        "max_queued": snap.max_queued,
        "by_class": by_class,
        "by_tenant": by_tenant,
        "oldest_wait_seconds": snap.oldest_wait.as_secs_f64(),
        "drain_per_second": snap.drain_rate,
        // Whole seconds, rounded up (what a `Retry-After` header can say).
        "retry_after_seconds": queue.retry_after().as_secs_f64().ceil() as u64,
    })
}
