//! Live load per worker end to end: the KV each request holds on its worker (kvgate's own
//! account, shown by `GET /pools` while a stream is open and given back when it ends),
//! routing to the worker with the most room (not the one with the fewest requests), and
//! the engine's own load report polled on the health interval.

mod support;

use http::Method;
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const KV: u64 = 40960;
const TOKEN_ENV: &str = "KVGATE_LOAD_TEST_TOKEN";
const TOKEN: &str = "load-test-token";

/// The standard config with an admin token and a short health interval.
fn config(pools: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    config_with_pools(WINDOW, pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace(
            "[audit]\n",
            "[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\n\n[audit]\n",
        )
}

/// A unified engine that takes 50 ms per generated token (streams stay open).
async fn slow(kv_tokens: u64) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: kv_tokens as usize,
        context_length: WINDOW as usize,
        token_latency: Duration::from_millis(50),
        ..SimConfig::default()
    })
    .await
}

/// Open a `/generate` stream that may generate `max_new` tokens; returns its body once
/// the first event came (so it is routed and running).
async fn open_stream(gw: &RunningGateway, max_new: u64) -> Incoming {
    let body = json!({"text": "tell me a story", "stream": true,
        "sampling_params": {"max_new_tokens": max_new}});
    let response = send(request(
        Method::POST,
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        body.to_string(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body
        .frame()
        .await
        .expect("a first event")
        .expect("readable");
    assert!(first.is_data());
    assert!(!body.is_end_stream());
    body
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

/// Poll the admin port until the worker at `addr` satisfies `test` (bounded).
async fn wait_for(
    gw: &RunningGateway,
    addr: SocketAddr,
    what: &str,
    test: impl Fn(&Value) -> bool,
) -> Value {
    for _ in 0..800 {
        let view = worker_view(gw, addr).await;
        if test(&view) {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!(
        "worker {addr} never {what}: {}",
        worker_view(gw, addr).await
    );
}

fn kv_in_flight(view: &Value) -> u64 {
    view["kv_in_flight"].as_u64().expect("kv_in_flight")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_stream_holds_kv_and_new_requests_go_to_the_worker_with_more_room() {
    let a = slow(KV).await;
    let b = slow(KV).await;
    let gw = gateway(&config(&unified_pool(
        "p",
        &[worker(&a, None), worker(&b, None)],
    )))
    .await;
    for e in [&a, &b] {
        wait_for(&gw, e.http_addr, "eligible", |w| w["eligible"] == true).await;
    }

    // A long answer may take 30000 tokens of one worker's KV.
    let long = open_stream(&gw, 30_000).await;
    let (busy, idle) = if generations(&a).len() == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(generations(busy).len(), 1);
    let view = worker_view(&gw, busy.http_addr).await;
    let held = kv_in_flight(&view);
    assert!(held > 30_000, "prompt + 30000 new tokens: {view}");
    assert!(
        view["room"].as_u64().expect("room") <= KV - held,
        "room is capacity minus what is held (or the engine's larger count): {view}"
    );
    assert_eq!(view["outstanding"], 1);

    // A short one: the idle worker has the most room.
    let short = open_stream(&gw, 100).await;
    assert_eq!(generations(idle).len(), 1);

    // Both have one request outstanding now. Two more of 5000 tokens: the old rule (least
    // outstanding) would split them between the workers; the idle worker still has by far
    // the most room, so both go there.
    let third = open_stream(&gw, 5000).await;
    let fourth = open_stream(&gw, 5000).await;
    assert_eq!(generations(busy).len(), 1, "the busy worker got no more");
    assert_eq!(generations(idle).len(), 3);
    let view = worker_view(&gw, idle.http_addr).await;
    assert_eq!(view["outstanding"], 3);
    assert!(kv_in_flight(&view) > 10_100, "{view}");

    // Every stream ends: all the KV comes back, and the room is the whole pool again (once
    // the engines' reports show their KV freed too).
    drop((long, short, third, fourth));
    for e in [&a, &b] {
        wait_for(&gw, e.http_addr, "gave its KV back", |w| {
            w["kv_in_flight"] == 0 && w["outstanding"] == 0 && w["room"] == KV
        })
        .await;
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_load_report_shows_in_pools_after_a_health_interval() {
    let engine = slow(KV).await;
    let addr = engine.http_addr;
    let gw = gateway(&config(&unified_pool("p", &[worker(&engine, None)]))).await;
    let view = wait_for(&gw, addr, "reported its load", |w| {
        w["engine_load"].is_object()
    })
    .await;
    let report = &view["engine_load"];
    assert_eq!(report["running"], 0, "{view}");
    assert_eq!(report["waiting"], 0, "{view}");
    assert!(report["used_kv_tokens"].is_u64(), "{view}");
    assert!(report["age_seconds"].is_f64(), "{view}");

    // While a stream runs the engine says so at the next poll.
    let stream = open_stream(&gw, 2000).await;
    let view = wait_for(&gw, addr, "reported a running request", |w| {
        w["engine_load"]["running"] == 1
    })
    .await;
    assert!(
        view["engine_load"]["used_kv_tokens"].as_u64() > Some(0),
        "{view}"
    );
    drop(stream);
    wait_for(&gw, addr, "reported the stream's end", |w| {
        w["engine_load"]["running"] == 0 && w["kv_in_flight"] == 0
    })
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_a_load_report_keeps_none_and_still_serves() {
    // An OpenAI-style pool asks `/metrics` for vLLM's names; the sim serves SGLang's only.
    let engine = slow(KV).await;
    let addr = engine.http_addr;
    let pools = unified_pool("p", &[worker(&engine, Some(KV))])
        .replace("engine = \"sglang\"", "engine = \"openai\"");
    let gw = gateway(&config(&pools)).await;
    // Several health rounds pass (each one also polls the load).
    let view = wait_for(&gw, addr, "probed a few times", |w| {
        w["health"]["active_probe"]["consecutive_passes"].as_u64() >= Some(3)
    })
    .await;
    assert!(view["engine_load"].is_null(), "{view}");
    assert_eq!(view["room"], KV, "{view}");
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let body = json!({"model": "qwen3", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&url, Some(KEY), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    wait_for(&gw, addr, "gave its KV back", |w| w["kv_in_flight"] == 0).await;
    gw.shutdown().await;
}
