//! Series that exist at zero from start-up (issue 40): every counter, gauge and histogram
//! whose label values the config or a fixed enum names, registered before its first event,
//! so alerts and dashboards never meet an absent series (`rate()` of a series born at its
//! first increment misses that increment, and `absent()` guards clutter every alert).
//!
//! Registered again on every reload (new pools, tenants); registering an existing series
//! changes nothing. Labels are given in the order the code that counts them gives them: a
//! different order would be another series.

use crate::activity::{CODES, TRIP_REASONS};
use crate::config::{Config, PoolMode, Priority};

use super::{
    AUDIT_LINES_DROPPED_TOTAL, CONFIG_RELOADS_TOTAL, ERRORS_TOTAL, GUARD_TRIPS_TOTAL,
    HEALTH_PROBES_TOTAL, LEAK_SUSPECTED_TOTAL, LOAD_SHED_TOTAL, QUEUE_DEPTH, QUEUE_REFUSALS_TOTAL,
    QUEUE_WAIT_SECONDS, REQUEST_OUTCOMES_TOTAL, ROLLBACKS_TOTAL, UPSTREAM_RETRIES_TOTAL,
    WORKER_EJECTIONS_TOTAL, WORKER_KV_IN_FLIGHT,
};

/// The gateway's own outcomes of a request (`stack::rescue`, `stack::guard`).
const REQUEST_OUTCOMES: [&str; 4] = ["success", "error", "guard_error", "client_cancelled"];
/// The load ceilings that shed (`LOAD_SHED_TOTAL`).
const CEILINGS: [&str; 4] = [
    "in_flight",
    "pool_in_flight",
    "buffered_bytes",
    "token_counting",
];
/// Why the gateway queue refused (`stack::routing::wait`).
const QUEUE_REASONS: [&str; 3] = ["full", "shed", "timed_out"];
/// The endpoints' metric labels (`stack::api::Endpoint::label`; a test there keeps the two
/// lists equal), and `other` for unknown routes (`stack::rescue`).
pub const ENDPOINT_LABELS: [&str; 15] = [
    "chat",
    "completions",
    "generate",
    "models",
    "embeddings",
    "rerank",
    "score",
    "tokenize",
    "detokenize",
    "messages",
    "count_tokens",
    "responses",
    "responses_retrieve",
    "responses_cancel",
    "other",
];
/// Why a request was sent again (`UPSTREAM_RETRIES_TOTAL`).
const RETRY_REASONS: [&str; 2] = ["connect", "stale_connection"];
/// How a leg to an engine ends (`stack::dispatch::Leg`): these at zero; a leg that ends
/// with another of the gateway's codes (a buffer budget, say) starts its series there.
const UPSTREAM_OUTCOMES: [&str; 7] = [
    "ok",
    "status_4xx",
    "status_5xx",
    "upstream_unavailable",
    "upstream_timeout",
    "upstream_protocol_error",
    "cancelled",
];
/// What a worker's failures that eject it are (`Leg::finish`, `RequestSignals`).
const EJECTION_CAUSES: [&str; 5] = [
    "status_5xx",
    "upstream_unavailable",
    "upstream_timeout",
    "upstream_protocol_error",
    "guard_trip",
];
/// The signals a canary is rolled back for besides one per trip reason
/// (`rollout::decide::judge`, `admin` for the admin API's), and where the decision came from.
const ROLLBACK_SIGNALS: [&str; 5] = [
    "guard_trips",
    "engine_errors",
    "leak_suspicions",
    "ttft_p99",
    "admin",
];
const ROLLBACK_ORIGINS: [&str; 3] = ["automatic", "admin", "shared"];

/// One worker's series (labels `pool`, `role`, `worker`, as `Worker` gives them): its KV
/// in flight, its ejections by cause and its health probes by result.
pub fn worker(labels: &[(&'static str, String); 3]) {
    use ::metrics::{counter, gauge};
    gauge!(WORKER_KV_IN_FLIGHT, labels).increment(0.0);
    for cause in EJECTION_CAUSES {
        let mut l = labels.to_vec();
        l.push(("cause", cause.to_owned()));
        counter!(WORKER_EJECTIONS_TOTAL, &l).increment(0);
    }
    for result in ["ok", "failed"] {
        let mut l = labels.to_vec();
        l.push(("result", result.to_owned()));
        counter!(HEALTH_PROBES_TOTAL, &l).increment(0);
    }
}

/// Register every series `config` and the fixed enums name, at zero.
pub fn register(config: &Config) {
    super::handle(); // a handle taken before the recorder would count nowhere
    use ::metrics::{counter, gauge, histogram};
    counter!(AUDIT_LINES_DROPPED_TOTAL).increment(0);
    for endpoint in ENDPOINT_LABELS {
        // The request path's own cached handle: the same series.
        let _ = super::per_request::duration(endpoint);
    }
    for result in ["ok", "error"] {
        counter!(CONFIG_RELOADS_TOTAL, "result" => result).increment(0);
    }
    for outcome in REQUEST_OUTCOMES {
        counter!(REQUEST_OUTCOMES_TOTAL, "outcome" => outcome).increment(0);
    }
    // Error codes: the status page's list, less the two stream outcomes and `other`.
    for code in CODES
        .iter()
        .filter(|c| !matches!(**c, "guard_error" | "client_cancelled" | "other"))
    {
        counter!(ERRORS_TOTAL, "code" => *code).increment(0);
    }
    for ceiling in CEILINGS {
        counter!(LOAD_SHED_TOTAL, "ceiling" => ceiling).increment(0);
    }
    rollouts(config);
    crate::vision::metrics::register(config);
    for pool in &config.pools {
        let roles: &[&'static str] = match pool.mode {
            PoolMode::Disaggregated => &["prefill", "decode"],
            PoolMode::Unified => &["unified"],
        };
        let pool = pool.name.as_str();
        for reason in TRIP_REASONS.iter().filter(|r| **r != "other") {
            counter!(GUARD_TRIPS_TOTAL, "reason" => *reason, "pool" => pool.to_owned())
                .increment(0);
        }
        counter!(LEAK_SUSPECTED_TOTAL, "pool" => pool.to_owned()).increment(0);
        for reason in RETRY_REASONS {
            counter!(UPSTREAM_RETRIES_TOTAL, "pool" => pool.to_owned(), "reason" => reason)
                .increment(0);
        }
        let pool_key: std::sync::Arc<str> = std::sync::Arc::from(pool);
        for role in roles {
            for outcome in UPSTREAM_OUTCOMES {
                // The request path's own cached handle: the same series.
                super::per_request::upstream(&pool_key, role, outcome).increment(0);
            }
        }
        for class in Priority::ALL {
            // The queue sets its depth on every change; until the first, it is empty.
            let depth = gauge!(QUEUE_DEPTH, "pool" => pool.to_owned(), "class" => class.as_str());
            depth.increment(0.0);
            let _ = histogram!(QUEUE_WAIT_SECONDS, "pool" => pool.to_owned(), "class" => class.as_str());
            for tenant in &config.tenants {
                for reason in QUEUE_REASONS {
                    counter!(
                        QUEUE_REFUSALS_TOTAL,
                        "pool" => pool.to_owned(),
                        "tenant" => tenant.name.clone(),
                        "class" => class.as_str(),
                        "reason" => reason
                    )
                    .increment(0);
                }
            }
        }
    }
}

/// Each rollout's rollbacks, by every signal and origin.
fn rollouts(config: &Config) {
    let trips = TRIP_REASONS
        .iter()
        .filter(|r| **r != "other")
        .map(|r| format!("guard_trips/{r}"));
    let signals: Vec<String> = ROLLBACK_SIGNALS
        .iter()
        .map(|s| (*s).to_owned())
        .chain(trips)
        .collect();
    for rollout in &config.rollouts {
        for signal in &signals {
            for origin in ROLLBACK_ORIGINS {
                ::metrics::counter!(ROLLBACKS_TOTAL,
                    "model" => rollout.model.clone(),
                    "pool" => rollout.canary.clone(),
                    "signal" => signal.clone(),
                    "origin" => origin)
                .increment(0);
            }
        }
    }
}
