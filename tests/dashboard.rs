//! The Grafana dashboard (`deploy/grafana/kvgate-dashboard.json`) against a running
//! gateway: every metric its queries name (panels and template variables) is one kvgate
//! exports — from start-up, before any request, since every series whose labels the config
//! or a fixed enum knows exists at zero (issue 40).

mod support;

use regex::Regex;
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kvgate_sim::{SimFault, SimRole};
use support::*;

fn dashboard() -> Value {
    let path = repo().join("deploy/grafana/kvgate-dashboard.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every PromQL text in the dashboard: panel targets' `expr` (rows nest panels) and the
/// template variables' queries.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", Value::String(q)) => out.push(q.clone()),
                    ("query", Value::String(q)) => out.push(q.clone()),
                    _ => queries(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

/// The metric names a query names, histogram suffixes stripped.
fn metric_names(query: &str) -> Vec<String> {
    let name = Regex::new(r"\bkvgate_[a-z0-9_]+").expect("regex");
    name.find_iter(query)
        .map(|m| {
            let n = m.as_str();
            ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n)
                .to_owned()
        })
        .collect()
}

/// The metric families a `/metrics` text exports (its `# TYPE` lines).
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_dashboard_is_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "kvgate-overview");
    let mut all = Vec::new();
    queries(&d, &mut all);
    let names: BTreeSet<String> = all.iter().flat_map(|q| metric_names(q)).collect();
    // Each section of the issue has its panels.
    for needed in [
        "kvgate_tenant_prompt_tokens_total",
        "kvgate_tenant_requests_total",
        "kvgate_worker_outstanding_requests",
        "kvgate_queue_depth",
        "kvgate_queue_refusals_total",
        "kvgate_guard_trips_total",
        "kvgate_leak_suspected_total",
        "kvgate_time_to_first_token_seconds",
        "kvgate_inter_token_seconds",
    ] {
        assert!(names.contains(needed), "{needed} not in {names:?}");
    }
    // Every panel names a data source variable, not a fixed uid.
    let mut panels = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        panels.push(p);
    }
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            p["targets"].as_array().is_some_and(|t| !t.is_empty()),
            "{}",
            p["title"]
        );
    }
}

/// `/metrics` once the gateway is ready (its workers' gauges published), before any request.
async fn metrics_when_ready(gw: &kvgate::runtime::RunningGateway) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&format!("http://{}/ready", gw.admin_addr()), None)
        .await
        .status
        != 200
    {
        assert!(Instant::now() < deadline, "the gateway never got ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported_from_start_up() {
    let mut all = Vec::new();
    queries(&dashboard(), &mut all);
    let names: BTreeSet<String> = all.iter().flat_map(|q| metric_names(q)).collect();
    assert!(names.len() >= 15, "{names:?}");

    let engine = engine(SimRole::Unified, SimFault::None, 8192, 8192).await;
    let pools = unified_pool("p", &[worker(&engine, Some(8192))]);
    let gw = gateway(&config_with_pools(8192, &pools)).await;
    // Ready: the worker's gauges are published; no request has been sent.
    let text = metrics_when_ready(&gw).await;
    let families = exported(&text);
    let missing: Vec<&String> = names.iter().filter(|n| !families.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not export: {missing:?}\n{text}"
    );
    gw.shutdown().await;
}

/// The series of workers, of the legs to them and of rollouts exist at zero from start-up
/// too (issue 40): a worker's KV in flight, its ejections by cause and its health probes by
/// result; each pool role's upstream requests by outcome; a pool's weight; a rollout's
/// rollbacks by signal and origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_upstream_and_rollout_series_exist_at_zero_from_start_up() {
    let stable = engine(SimRole::Unified, SimFault::None, 8192, 8192).await;
    let canary = engine(SimRole::Unified, SimFault::None, 8192, 8192).await;
    let pools = format!(
        "{}weight = 90\n{}weight = 10\n\n[[rollouts]]\nmodel = \"qwen3\"\nstable = \"stable\"\ncanary = \"canary\"\n",
        unified_pool("stable", &[worker(&stable, Some(8192))]),
        unified_pool("canary", &[worker(&canary, Some(8192))]),
    );
    let gw = gateway(&config_with_pools(8192, &pools)).await;
    let text = metrics_when_ready(&gw).await;
    let value = |series: String| -> Option<f64> {
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    };
    let authority = stable.http_addr.to_string();
    let w = format!("pool=\"stable\",role=\"unified\",worker=\"{authority}\"");
    assert_eq!(
        value(format!("kvgate_worker_kv_in_flight_tokens{{{w}}}")),
        Some(0.0),
        "{text}"
    );
    for cause in [
        "status_5xx",
        "upstream_unavailable",
        "upstream_timeout",
        "upstream_protocol_error",
        "guard_trip",
    ] {
        assert_eq!(
            value(format!(
                "kvgate_worker_ejections_total{{{w},cause=\"{cause}\"}}"
            )),
            Some(0.0),
            "{cause}"
        );
    }
    // Probes may have run already: the series exist, whatever they count.
    for result in ["ok", "failed"] {
        assert!(
            value(format!(
                "kvgate_health_probes_total{{{w},result=\"{result}\"}}"
            ))
            .is_some(),
            "{result}\n{text}"
        );
    }
    for outcome in [
        "ok",
        "status_5xx",
        "upstream_unavailable",
        "upstream_timeout",
    ] {
        assert_eq!(
            value(format!(
                "kvgate_upstream_requests_total{{pool=\"canary\",role=\"unified\",outcome=\"{outcome}\"}}"
            )),
            Some(0.0),
            "{outcome}"
        );
    }
    assert_eq!(
        value("kvgate_pool_weight{pool=\"stable\"}".into()),
        Some(90.0)
    );
    assert_eq!(
        value("kvgate_pool_weight{pool=\"canary\"}".into()),
        Some(10.0)
    );
    for (signal, origin) in [
        ("engine_errors", "automatic"),
        ("guard_trips/abort", "automatic"),
        ("admin", "admin"),
        ("ttft_p99", "shared"),
    ] {
        assert_eq!(
            value(format!(
                "kvgate_rollout_rollbacks_total{{model=\"qwen3\",pool=\"canary\",signal=\"{signal}\",origin=\"{origin}\"}}"
            )),
            Some(0.0),
            "{signal} {origin}\n{text}"
        );
    }
    gw.shutdown().await;
}
