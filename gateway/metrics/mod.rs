//! Metric names, descriptions and the Prometheus recorder.
//!
//! Names are `kvgate_` prefixed, counters end in `_total`, units are base units. Labels are
//! bounded: endpoint, status class, pool and worker names come from the config, never from
//! the request.

pub mod per_request;
pub mod zero;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Limit-store failures, by backend (counter).
pub const STORE_ERRORS_TOTAL: &str = "kvgate_limit_store_errors_total";
/// 1 while the limit store answers, 0 after a failure until it answers again (gauge).
pub const STORE_HEALTHY: &str = "kvgate_limit_store_healthy";
/// Redis failures by what they mean (`reason`: unreachable, moved, readonly, wrongtype,
/// crossslot, auth, other) and who met them (`user`: limits, rollout, prefix, responses).
pub const REDIS_PROBLEMS_TOTAL: &str = "kvgate_redis_problems_total";
/// Requests answered by the data port, by endpoint and status code.
pub const REQUESTS_TOTAL: &str = "kvgate_requests_total";
/// Time from request to response headers, by endpoint.
pub const REQUEST_DURATION_SECONDS: &str = "kvgate_request_duration_seconds";
/// Gateway errors by code (`GatewayError::code`).
pub const ERRORS_TOTAL: &str = "kvgate_errors_total";
/// Requests sent to engines, by pool, role and outcome.
pub const UPSTREAM_REQUESTS_TOTAL: &str = "kvgate_upstream_requests_total";
/// Requests currently outstanding at a worker (until its response body ends).
pub const WORKER_OUTSTANDING: &str = "kvgate_worker_outstanding_requests";
/// KV tokens kvgate has in flight at a worker (its own account: prompt + allowed new tokens
/// of every request until its body ends).
pub const WORKER_KV_IN_FLIGHT: &str = "kvgate_worker_kv_in_flight_tokens";
/// Requests waiting in a worker's engine queue, as the engine last reported.
pub const WORKER_ENGINE_WAITING: &str = "kvgate_worker_engine_waiting_requests";
/// 1 when a worker may serve traffic, 0 when not (unknown capacity, unreachable).
pub const WORKER_ELIGIBLE: &str = "kvgate_worker_eligible";
/// A worker's KV pool in tokens, by source (configured / discovered / enforced).
pub const WORKER_KV_TOKENS: &str = "kvgate_worker_kv_tokens";
/// Configured and discovered capacity disagree for a worker (1) or agree (0).
pub const WORKER_CAPACITY_MISMATCH: &str = "kvgate_worker_capacity_mismatch";
/// A worker's health: 1 serving, 0 failing its active check or ejected.
pub const WORKER_HEALTHY: &str = "kvgate_worker_healthy";
/// Outlier ejections of a worker, by pool, role, worker and cause.
pub const WORKER_EJECTIONS_TOTAL: &str = "kvgate_worker_ejections_total";
/// Active health probes, by pool, role, worker and result (ok / failed).
pub const HEALTH_PROBES_TOTAL: &str = "kvgate_health_probes_total";
/// Certificate reloads (data port `server`, `engines`), by result (ok / error).
pub const TLS_RELOADS_TOTAL: &str = "kvgate_tls_reloads_total";
/// Failed resolutions of a discovered worker name (error, timeout, empty answer after a
/// good one), by pool and name.
pub const DISCOVERY_DNS_FAILURES_TOTAL: &str = "kvgate_discovery_dns_failures_total";
/// 1 while a discovered worker name serves from its last good answer (its latest
/// resolution failed), 0 when fresh; by pool and name.
pub const DISCOVERY_DNS_STALE: &str = "kvgate_discovery_dns_stale";
/// Changes of a pool's workers brought by DNS, by result (ok / error).
pub const DISCOVERY_DNS_UPDATES_TOTAL: &str = "kvgate_discovery_dns_updates_total";
/// Config reloads (SIGHUP, `POST /reload`), by result (ok / error).
pub const CONFIG_RELOADS_TOTAL: &str = "kvgate_config_reloads_total";
/// Responses the guard stopped, by reason and pool.
pub const GUARD_TRIPS_TOTAL: &str = "kvgate_guard_trips_total";
/// Every accepted request's single outcome (I6): success, error, guard_error, client_cancelled.
pub const REQUEST_OUTCOMES_TOTAL: &str = "kvgate_request_outcomes_total";
/// Answers holding fragments of other tenants' recent prompts, by pool (I5).
pub const LEAK_SUSPECTED_TOTAL: &str = "kvgate_leak_suspected_total";
/// Data-port connections currently open.
pub const CONNECTIONS_OPEN: &str = "kvgate_connections_open";
/// Requests refused at a load ceiling, by ceiling (in_flight, pool_in_flight, buffered_bytes).
pub const LOAD_SHED_TOTAL: &str = "kvgate_load_shed_total";
/// Stored responses whose owner could not be written to the shared map (Redis down): other
/// replicas answer 404 for them until it is back.
pub const RESPONSE_OWNER_WRITE_FAILURES_TOTAL: &str = "kvgate_response_owner_write_failures_total";
/// Requests waiting in a pool's gateway queue, by pool and class (gauge).
pub const QUEUE_DEPTH: &str = "kvgate_queue_depth";
/// Requests routed inside a pool that chooses by prompt prefix, by pool and outcome: `hit`
/// (the worker holding the longest prefix), `miss` (no worker held any of it) or
/// `balanced` (the prefix's worker was busier than the least loaded by over the margin).
pub const PREFIX_ROUTE_TOTAL: &str = "kvgate_prefix_route_total";
/// Full prompt blocks of the requests routed by prefix, by pool.
pub const PREFIX_PROMPT_BLOCKS_TOTAL: &str = "kvgate_prefix_prompt_blocks_total";
/// Of those, the blocks the chosen worker was known to hold already, by pool.
pub const PREFIX_MATCHED_BLOCKS_TOTAL: &str = "kvgate_prefix_matched_blocks_total";
/// 1 while this replica shares its prefix indexes through Redis, 0 after a failure until it
/// answers again (gauge; only with `[limits]` in Redis).
pub const PREFIX_SHARED_OK: &str = "kvgate_prefix_shared_ok";
/// Entries of a pool's shared prefix stream that do not read as one replica's inserts,
/// skipped (counter; by pool).
pub const PREFIX_SHARED_BAD_ENTRIES_TOTAL: &str = "kvgate_prefix_shared_bad_entries_total";
/// Rounds of prefix sharing that failed, by reason: `unreachable` (Redis did not answer),
/// `wrong_type` (a stream key holds another type), `restarted` (a stream was found behind
/// what was read of it, recreated or reset, and is read again from its start).
pub const PREFIX_SHARED_PROBLEMS_TOTAL: &str = "kvgate_prefix_shared_problems_total";
/// Time a request waited in a pool's gateway queue before its turn, by pool and class.
pub const QUEUE_WAIT_SECONDS: &str = "kvgate_queue_wait_seconds";
/// Requests the gateway queue refused, by pool, tenant, class and reason (full, shed,
/// timed_out).
pub const QUEUE_REFUSALS_TOTAL: &str = "kvgate_queue_refusals_total";
/// Audit lines dropped because the sink fell behind by a whole queue.
pub const AUDIT_LINES_DROPPED_TOTAL: &str = "kvgate_audit_lines_dropped_total";
/// Trace spans dropped: the export queue was full, or the collector refused or missed a batch.
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "kvgate_trace_spans_dropped_total";
/// OTLP export requests, by outcome (ok, error, timeout).
pub const TRACE_EXPORTS_TOTAL: &str = "kvgate_trace_exports_total";
/// Requests sent again, by pool and reason: `connect` (on another worker after a connect
/// failure), `stale_connection` (on a fresh connection after a reused one closed before any
/// answer byte).
pub const UPSTREAM_RETRIES_TOTAL: &str = "kvgate_upstream_retries_total";
/// Canary rollbacks, by model, canary pool, signal and origin.
pub const ROLLBACKS_TOTAL: &str = "kvgate_rollout_rollbacks_total";
/// A rollout's phase: 0 canary, 1 rolled back, 2 promoted.
pub const ROLLOUT_PHASE: &str = "kvgate_rollout_phase";
/// A pool's current traffic weight.
pub const POOL_WEIGHT: &str = "kvgate_pool_weight";
/// 1 while this replica can read and publish shared rollout decisions in Redis.
pub const ROLLOUT_SHARED_OK: &str = "kvgate_rollout_shared_ok";

// === tenant accounting (issue 40) ===

/// Requests of a configured tenant by model and outcome (`accounting::Outcome`: ok,
/// refused, engine_error, guard_trip, client_gone, internal_error); every series exists at
/// zero from start-up.
pub const TENANT_REQUESTS_TOTAL: &str = "kvgate_tenant_requests_total";
/// Prompt tokens the engines reported for a tenant's requests, by tenant and model.
pub const TENANT_PROMPT_TOKENS_TOTAL: &str = "kvgate_tenant_prompt_tokens_total";
/// Completion tokens the engines reported, by tenant and model.
pub const TENANT_COMPLETION_TOKENS_TOTAL: &str = "kvgate_tenant_completion_tokens_total";
/// Prompt tokens the engines found in their prefix cache (part of the prompt tokens), by
/// tenant and model.
pub const TENANT_CACHED_TOKENS_TOTAL: &str = "kvgate_tenant_cached_tokens_total";
/// Served requests whose engine reported no usage (their tokens are not in the token
/// counters), by tenant and model.
pub const TENANT_UNREPORTED_USAGE_TOTAL: &str = "kvgate_tenant_unreported_usage_total";
/// Time from a streamed request's arrival to its first event at the client, by pool and
/// class (histogram).
pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "kvgate_time_to_first_token_seconds";
/// A stream's mean time between tokens after the first, one observation per stream, by pool
/// and class (histogram).
pub const INTER_TOKEN_SECONDS: &str = "kvgate_inter_token_seconds";

/// Time to first token: from a few ms (a cached prefix) to tens of seconds (a long prompt
/// behind a queue).
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0,
];
/// Inter-token latency: a decode step is ms to a few hundred ms.
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
];

const DURATION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// The process-wide Prometheus handle. The first call installs the recorder; later calls
/// (several gateways in one test process) share it.
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        use metrics_exporter_prometheus::Matcher;
        // Full names sort before suffixes in the exporter: the token latencies get their
        // own buckets, every other `_seconds` histogram the general ones.
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), DURATION_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    Matcher::Full(TIME_TO_FIRST_TOKEN_SECONDS.into()),
                    TTFT_BUCKETS,
                )
            })
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(INTER_TOKEN_SECONDS.into()), ITL_BUCKETS)
            })
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (an embedding application); then ours
        // still renders what it saw, which is nothing, and the embedder's wins.
        let _ = metrics::set_global_recorder(recorder);
        describe_all();
        handle
    })
}

fn describe_all() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS_TOTAL, "Requests answered on the data port");
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "Time until response headers"
    );
    describe_counter!(ERRORS_TOTAL, "Gateway errors by code");
    describe_counter!(
        UPSTREAM_REQUESTS_TOTAL,
        "Requests sent to engines: one outcome per leg"
    );
    describe_gauge!(WORKER_OUTSTANDING, "Outstanding requests per worker");
    describe_gauge!(
        WORKER_KV_IN_FLIGHT,
        Unit::Count,
        "KV tokens kvgate has in flight per worker (prompt + allowed new tokens)"
    );
    describe_gauge!(
        WORKER_ENGINE_WAITING,
        "Requests waiting in a worker's engine queue, as the engine last reported"
    );
    describe_gauge!(WORKER_ELIGIBLE, "1 if a worker may serve traffic");
    describe_gauge!(
        WORKER_HEALTHY,
        "1 if a worker passes its health checks and is not ejected"
    );
    describe_counter!(WORKER_EJECTIONS_TOTAL, "Outlier ejections of workers");
    describe_counter!(HEALTH_PROBES_TOTAL, "Active health probes of workers");
    describe_counter!(CONFIG_RELOADS_TOTAL, "Config reloads, by result");
    describe_counter!(
        DISCOVERY_DNS_FAILURES_TOTAL,
        "Failed resolutions of a discovered worker name (the last answer is kept)"
    );
    describe_gauge!(
        DISCOVERY_DNS_STALE,
        "1 while a discovered worker name serves from its last good answer"
    );
    describe_counter!(
        DISCOVERY_DNS_UPDATES_TOTAL,
        "Worker sets changed by DNS and applied (ok) or refused (error)"
    );
    describe_counter!(
        TLS_RELOADS_TOTAL,
        "Certificate reloads of the data port and of TLS to engines"
    );
    describe_gauge!(WORKER_KV_TOKENS, "Worker KV pool size in tokens");
    describe_gauge!(
        WORKER_CAPACITY_MISMATCH,
        "1 if configured and discovered KV capacity disagree"
    );
    describe_gauge!(CONNECTIONS_OPEN, "Open data-port connections");
    describe_counter!(
        RESPONSE_OWNER_WRITE_FAILURES_TOTAL,
        "Stored responses whose owner was not written to the shared map"
    );
    describe_counter!(
        PREFIX_ROUTE_TOTAL,
        "Requests routed by prompt prefix inside a pool: hit, miss or balanced"
    );
    describe_counter!(
        PREFIX_PROMPT_BLOCKS_TOTAL,
        "Full KV blocks of the prompts routed by prefix"
    );
    describe_gauge!(
        PREFIX_SHARED_OK,
        "1 while prefix indexes are shared with the other replicas through Redis"
    );
    describe_counter!(
        PREFIX_SHARED_BAD_ENTRIES_TOTAL,
        "Malformed entries of a shared prefix stream, skipped"
    );
    describe_counter!(
        PREFIX_SHARED_PROBLEMS_TOTAL,
        "Prefix-sharing problems: Redis unreachable, a key of the wrong type, a stream restarted"
    );
    describe_counter!(
        PREFIX_MATCHED_BLOCKS_TOTAL,
        "KV blocks the chosen worker was known to hold already"
    );
    describe_counter!(LOAD_SHED_TOTAL, "Requests refused at a load ceiling");
    describe_gauge!(QUEUE_DEPTH, "Requests waiting in a pool's gateway queue");
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time waited in a pool's gateway queue before a turn"
    );
    describe_counter!(
        QUEUE_REFUSALS_TOTAL,
        "Requests the gateway queue refused (full, shed, timed_out)"
    );
    describe_counter!(
        AUDIT_LINES_DROPPED_TOTAL,
        "Audit lines dropped because the sink fell behind"
    );
    describe_counter!(
        TRACE_SPANS_DROPPED_TOTAL,
        "Trace spans dropped (export queue full, or the export failed)"
    );
    describe_counter!(TRACE_EXPORTS_TOTAL, "OTLP trace export requests by outcome");
    describe_counter!(
        UPSTREAM_RETRIES_TOTAL,
        "Retries on another worker after a connect failure"
    );
    describe_counter!(GUARD_TRIPS_TOTAL, "Responses stopped by the guard");
    describe_counter!(
        LEAK_SUSPECTED_TOTAL,
        "Answers with other tenants' prompt fragments"
    );
    describe_counter!(REQUEST_OUTCOMES_TOTAL, "Request outcomes, one per request");
    describe_counter!(ROLLBACKS_TOTAL, "Canary pools rolled back, by signal");
    describe_gauge!(ROLLOUT_PHASE, "0 canary, 1 rolled back, 2 promoted");
    describe_gauge!(POOL_WEIGHT, "A pool's current traffic weight");
    describe_gauge!(
        ROLLOUT_SHARED_OK,
        "1 while shared rollout decisions in Redis are reachable"
    );
    describe_counter!(
        TENANT_REQUESTS_TOTAL,
        "Requests of a configured tenant, by model and outcome"
    );
    describe_counter!(
        TENANT_PROMPT_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens the engines reported, by tenant and model"
    );
    describe_counter!(
        TENANT_COMPLETION_TOKENS_TOTAL,
        Unit::Count,
        "Completion tokens the engines reported, by tenant and model"
    );
    describe_counter!(
        TENANT_CACHED_TOKENS_TOTAL,
        Unit::Count,
        "Prompt tokens served from the engines' prefix cache, by tenant and model"
    );
    describe_counter!(
        TENANT_UNREPORTED_USAGE_TOTAL,
        "Served requests whose engine reported no usage (tokens not counted)"
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN_SECONDS,
        Unit::Seconds,
        "Time from a streamed request's arrival to its first event, by pool and class"
    );
    describe_histogram!(
        INTER_TOKEN_SECONDS,
        Unit::Seconds,
        "A stream's mean time between tokens after the first, by pool and class"
    );
    describe_counter!(STORE_ERRORS_TOTAL, "Limit store failures by backend");
    describe_gauge!(STORE_HEALTHY, "1 if the limit store answers");
    describe_counter!(
        REDIS_PROBLEMS_TOTAL,
        "Redis failures by reason (unreachable, or a misconfiguration: moved, readonly, wrongtype, crossslot, auth) and user"
    );
}
