//! Worker health end to end: active checks take a dead worker out and bring it back only
//! after its capacity was discovered again; passive outlier ejection takes out a worker
//! whose answers keep failing (connect failures, guard trips), tries it again after a
//! growing backoff, and never takes more than its share of a pool; with no worker left the
//! answer is 503 with `Retry-After`, at once.

mod support;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const TOKEN_ENV: &str = "KVGATE_HEALTH_TEST_TOKEN";
const TOKEN: &str = "health-test-token";

/// The standard config with an admin token and `health` as the `[health]` table.
fn config(pools: &str, health: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    config_with_pools(WINDOW, pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace("[audit]\n", &format!("{health}\n\n[audit]\n"))
}

fn chat() -> Value {
    json!({"model": "qwen3", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]})
}

async fn chat_reply(gw: &RunningGateway) -> Reply {
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    post(&url, Some(KEY), &chat()).await
}

/// The admin port's view of the worker at `addr`.
async fn worker_view(gw: &RunningGateway, addr: SocketAddr) -> Value {
    let url = format!("http://{}/pools", gw.admin_addr());
    let pools = read(send(request(Method::GET, &url, Some(TOKEN), "")).await)
        .await
        .json();
    pools["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["workers"].as_array().cloned().unwrap_or_default())
        .find(|w| w["worker"] == addr.to_string())
        .unwrap_or_else(|| panic!("worker {addr} not listed: {pools}"))
}

/// Poll the admin port until the worker at `addr` satisfies `test` (at most 20 s).
async fn wait_for(
    gw: &RunningGateway,
    addr: SocketAddr,
    what: &str,
    test: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let view = worker_view(gw, addr).await;
        if test(&view) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker {addr} never became {what}: {view}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn state(view: &Value) -> &str {
    view["health"]["state"].as_str().unwrap_or_default()
}

async fn unified(fault: SimFault, kv_tokens: usize) -> RunningSim {
    engine(SimRole::Unified, fault, kv_tokens, WINDOW as usize).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_under_load_is_taken_out_and_returns_with_its_capacity_rediscovered() {
    let a = unified(SimFault::None, 40960).await;
    let b = unified(SimFault::None, 40960).await;
    let b_addr = b.http_addr;
    let health = "[health]\ninterval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_threshold = 2\nhealthy_threshold = 2\n[health.outlier]\nconsecutive_failures = 3\nbase_ejection = \"30s\"";
    let pools = unified_pool("p", &[worker(&a, None), worker(&b, None)]);
    let gw = Arc::new(gateway(&config(&pools, health)).await);

    // Four clients in a loop; every failed reply is kept.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (gw, stop, served) = (gw.clone(), stop.clone(), served.clone());
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let reply = chat_reply(&gw).await;
                if reply.status == StatusCode::OK {
                    served.fetch_add(1, Ordering::Relaxed);
                } else {
                    failures.push(format!("{} {}", reply.status, reply.text()));
                }
            }
            failures
        }));
    }
    while served.load(Ordering::Relaxed) < 40 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!generations(&b).is_empty(), "both workers served before");

    // Kill b mid-load: its connect failures eject it at once, and its health checks then
    // find it down.
    b.shutdown().await;
    wait_for(&gw, b_addr, "taken out", |w| w["eligible"] == false).await;
    wait_for(&gw, b_addr, "down", |w| state(w) == "down").await;
    let at_ejection = served.load(Ordering::Relaxed);
    while served.load(Ordering::Relaxed) < at_ejection + 40 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // b comes back on the same address with a smaller KV pool: it serves again only once
    // the new capacity is known (an ejection is not waited out: the probes decide).
    let listener = tokio::net::TcpListener::bind(b_addr)
        .await
        .expect("rebind b's port");
    let b2 = kvgate_sim::spawn(
        SimConfig {
            role: SimRole::Unified,
            model: "qwen3".into(),
            kv_tokens: 20480,
            context_length: WINDOW as usize,
            ..SimConfig::default()
        },
        qwen3(),
        listener,
        None,
    )
    .await
    .expect("b restarts");
    let view = wait_for(&gw, b_addr, "back", |w| {
        w["eligible"] == true && matches!(state(w), "serving" | "trial")
    })
    .await;
    assert_eq!(view["kv_tokens"], 20480, "capacity rediscovered: {view}");
    let before = served.load(Ordering::Relaxed);
    while generations(&b2).is_empty() {
        assert!(
            served.load(Ordering::Relaxed) < before + 400,
            "b never got traffic back"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_for(&gw, b_addr, "serving", |w| state(w) == "serving").await;

    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for c in clients {
        failures.extend(c.await.expect("client task"));
    }
    eprintln!("client-visible failures after the kill: {}", failures.len());
    // Only requests already on b when it died may fail (at most one per client).
    assert!(
        failures.len() <= 4,
        "{} failures: {failures:?}",
        failures.len()
    );
    let metrics = kvgate::metrics::handle().render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kvgate_health_probes_total")
                && l.contains("result=\"failed\"")
                && l.contains(&b_addr.to_string())
                // The series exists at zero from start-up: its value says the probe failed.
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)),
        "{metrics}"
    );
    match Arc::try_unwrap(gw) {
        Ok(gw) => gw.shutdown().await,
        Err(_) => panic!("gateway still shared"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_answers_trip_the_guard_is_ejected_tried_again_and_ejected_for_longer() {
    let good = unified(SimFault::None, 40960).await;
    let bad = unified(SimFault::AbortNoStatus, 40960).await;
    // Active checks off: /health of the aborting engine is fine anyway.
    let health = "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 3\nbase_ejection = \"1s\"\nmax_ejection = \"1m\"";
    let pools = unified_pool("p", &[worker(&good, None), worker(&bad, None)]);
    let gw = gateway(&config(&pools, health)).await;

    // Sequential requests alternate between the two (equal load): the bad one's third trip
    // in a row ejects it.
    let mut tripped = 0;
    for _ in 0..6 {
        let reply = chat_reply(&gw).await;
        if reply.status != StatusCode::OK {
            assert_eq!(error_code(&reply), "upstream_aborted", "{}", reply.text());
            tripped += 1;
        }
    }
    assert_eq!(tripped, 3, "three trips, then no more");
    let view = worker_view(&gw, bad.http_addr).await;
    assert_eq!(state(&view), "ejected", "{view}");
    assert_eq!(view["health"]["cause"], "guard_trip");
    assert_eq!(view["health"]["ejections"], 1);
    let sent = generations(&bad).len();
    for _ in 0..6 {
        assert_eq!(chat_reply(&gw).await.status, StatusCode::OK);
    }
    assert_eq!(
        generations(&bad).len(),
        sent,
        "an ejected worker gets nothing"
    );

    // After the backoff it is on trial: one request, which trips, ejects it for twice as
    // long.
    wait_for(&gw, bad.http_addr, "on trial", |w| state(w) == "trial").await;
    while generations(&bad).len() == sent {
        let reply = chat_reply(&gw).await;
        assert!(
            reply.status == StatusCode::OK || error_code(&reply) == "upstream_aborted",
            "{}",
            reply.text()
        );
    }
    let view = worker_view(&gw, bad.http_addr).await;
    assert_eq!(state(&view), "ejected", "{view}");
    assert_eq!(view["health"]["ejections"], 2);
    let left = view["health"]["ejected_for_seconds"].as_f64().unwrap();
    assert!(
        left > 1.0 && left <= 2.0,
        "the second ejection lasts 2 s: {view}"
    );
    let metrics = kvgate::metrics::handle().render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kvgate_worker_ejections_total")
                && l.contains("cause=\"guard_trip\"")
                && l.contains(&bad.http_addr.to_string())
                // The series exists at zero from start-up: its value says it ejected.
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_never_takes_more_than_its_share_of_a_pool() {
    let x = unified(SimFault::AbortNoStatus, 40960).await;
    let y = unified(SimFault::AbortNoStatus, 40960).await;
    let health = "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 2\nmax_ejected_share = 0.5";
    let pools = unified_pool("p", &[worker(&x, None), worker(&y, None)]);
    let gw = gateway(&config(&pools, health)).await;
    for _ in 0..12 {
        let reply = chat_reply(&gw).await;
        // Never 503: one of the two always serves (and the guard keeps its aborts from
        // being a 200).
        assert_eq!(error_code(&reply), "upstream_aborted", "{}", reply.text());
    }
    let states = [
        worker_view(&gw, x.http_addr).await,
        worker_view(&gw, y.http_addr).await,
    ];
    let ejected = states.iter().filter(|w| state(w) == "ejected").count();
    assert_eq!(ejected, 1, "half of two: {states:?}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_left_the_answer_is_503_with_retry_after_at_once() {
    let dead = bind().await.local_addr().unwrap(); // closed: connecting is refused
    let workers = [format!("{{ url = \"http://{dead}\", kv_tokens = 40960 }}")];
    let health = "[health]\ninterval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_threshold = 1\nhealthy_threshold = 30";
    let gw = gateway(&config(&unified_pool("p", &workers), health)).await;
    wait_for(&gw, dead, "down", |w| state(w) == "down").await;

    let reply = chat_reply(&gw).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&reply), "no_eligible_worker", "{}", reply.text());
    // 30 passed probes of 100 ms are needed to come back.
    assert_eq!(
        reply
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("3")
    );
    let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
    assert_eq!(
        ready.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        ready.text()
    );
    assert!(
        ready.text().contains("failing its health check"),
        "{}",
        ready.text()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn health_settings_are_checked_at_load() {
    for (table, key) in [
        (
            "[health]\ntimeout = \"10s\"\ninterval = \"1s\"",
            "health.timeout",
        ),
        (
            "[health]\nunhealthy_threshold = 0",
            "health.unhealthy_threshold",
        ),
        (
            "[health.outlier]\nmax_ejected_share = 2.0",
            "health.outlier.max_ejected_share",
        ),
    ] {
        let text = config_with_pools(
            WINDOW,
            &unified_pool(
                "p",
                &["{ url = \"http://127.0.0.1:9\", kv_tokens = 4096 }".into()],
            ),
        )
        .replace("[audit]\n", &format!("{table}\n\n[audit]\n"));
        let error = kvgate::config::Config::from_toml(&text, &repo().join("config/test.toml"))
            .expect_err(table)
            .to_string();
        assert!(error.contains(key), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_workers_smaller_kv_pool_still_bounds_admission() {
    // `small` aborts everything (so it is ejected) and holds 8192 tokens; `big` is fine
    // and holds 40960. An ejection ends on a timer: a prompt admitted while `small` is out
    // could be routed to it once it is back, so `small`'s pool still bounds admission (I2).
    let small = unified(SimFault::AbortNoStatus, 8192).await;
    let big = unified(SimFault::None, 40960).await;
    let health = "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 2\nbase_ejection = \"1m\"";
    let pools = unified_pool(
        "p",
        &[worker(&small, Some(8192)), worker(&big, Some(40960))],
    );
    let gw = gateway(&config(&pools, health)).await;
    while state(&worker_view(&gw, small.http_addr).await) != "ejected" {
        let reply = chat_reply(&gw).await;
        assert!(
            reply.status == StatusCode::OK || error_code(&reply) == "upstream_aborted",
            "{}",
            reply.text()
        );
    }
    let long = json!({"model": "qwen3", "max_tokens": 4,
        "messages": [{"role": "user", "content": "word ".repeat(12_000)}]});
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let sent = generations(&big).len();
    let reply = post(&url, Some(KEY), &long).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(error_code(&reply), "context_length_exceeded");
    assert!(error_message(&reply).contains("8185"), "{}", reply.text());
    assert_eq!(generations(&big).len(), sent, "nothing was sent");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_provoking_content_trips_cannot_eject_a_shared_worker() {
    // The simulated engine answers with its prompt, so a prompt carrying the configured
    // placeholder marker trips the guard every time. That trip is about what the answer
    // says, which a tenant controls: it must not take the worker from everyone else.
    let only = unified(SimFault::None, 40960).await;
    let health = "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 2\nmax_ejected_share = 1.0";
    let pools = format!(
        "{}[pools.guard]\nmarkers = [\"PLACEHOLDER-XYZ\"]\n",
        unified_pool("p", &[worker(&only, None)])
    );
    let gw = gateway(&config(&pools, health)).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let provoking = json!({"model": "qwen3", "max_tokens": 64,
        "messages": [{"role": "user", "content": "PLACEHOLDER-XYZ"}]});
    for _ in 0..6 {
        let reply = post(&url, Some(KEY), &provoking).await;
        assert_ne!(
            reply.status,
            StatusCode::OK,
            "the marker trips the guard: {}",
            reply.text()
        );
    }
    assert_eq!(state(&worker_view(&gw, only.http_addr).await), "serving");
    assert_eq!(chat_reply(&gw).await.status, StatusCode::OK);
    gw.shutdown().await;
}

/// `GET /pools` shows what the active probes say before they take a worker out: a worker
/// whose health path fails has its failed probes counted, with the error, under
/// `health.active_probe`, apart from the passive count of failed requests; a worker whose
/// probes pass says when one last passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_active_probes_show_in_the_pools_listing_before_the_worker_goes_down() {
    let failing = unified(SimFault::None, 40960).await;
    let fine = unified(SimFault::None, 40960).await;
    let pools = format!(
        "{}health_path = \"/no-such-health-path\"\n\n{}",
        unified_pool("failing", &[worker(&failing, None)]),
        unified_pool("fine", &[worker(&fine, None)])
    );
    // Never down within the test: only the count shows the failures.
    let health = "[health]\ninterval = \"100ms\"\ntimeout = \"100ms\"\nunhealthy_threshold = 1000\nhealthy_threshold = 1";
    let gw = gateway(&config(&pools, health)).await;

    let view = wait_for(
        &gw,
        failing.http_addr,
        "counted as failing its probes",
        |w| w["health"]["active_probe"]["consecutive_failures"].as_u64() >= Some(3),
    )
    .await;
    let probe = &view["health"]["active_probe"];
    assert_eq!(state(&view), "serving", "{view}");
    assert_eq!(view["health"]["path"], "/no-such-health-path");
    assert_eq!(
        view["health"]["consecutive_failures"], 0,
        "no request failed: {view}"
    );
    assert!(
        probe["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("404")),
        "{view}"
    );
    assert!(
        probe["last_failed_seconds_ago"].as_f64() < Some(5.0),
        "{view}"
    );
    assert_eq!(probe["last_ok_seconds_ago"], Value::Null, "{view}");
    assert_eq!(probe["consecutive_passes"], 0);

    let view = wait_for(&gw, fine.http_addr, "probed", |w| {
        w["health"]["active_probe"]["consecutive_passes"].as_u64() >= Some(2)
    })
    .await;
    let probe = &view["health"]["active_probe"];
    assert_eq!(probe["consecutive_failures"], 0, "{view}");
    assert_eq!(probe["last_error"], Value::Null, "{view}");
    assert!(probe["last_ok_seconds_ago"].as_f64() < Some(5.0), "{view}");
    gw.shutdown().await;
}
