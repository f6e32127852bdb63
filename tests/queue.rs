//! The gateway queue end to end (issue 30), with the simulated engine's saturation model:
//! a pool whose one worker holds one request at a time, so every other request waits its
//! turn at the gateway. Order is checked by the order answers complete, never by clocks.
//!
//! - a light tenant's request is served before a flooding tenant's backlog;
//! - a critical request is never served after a sheddable one queued before it;
//! - a full queue refuses the tenant that fills it, sheds that tenant's newest request for
//!   another tenant's and the lowest class for a higher one (503 with Retry-After), and a request
//!   past its deadline is refused; every refusal is audited;
//! - with the queue on the engine never holds more KV than its pool or queues a request
//!   itself; with `[scheduling] enabled = false` the engine queues them.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 4096;
/// The worker's KV pool: one request (≈ 40 prompt + 300 new tokens) fits, two do not.
const KV: u64 = 512;
const MAX_NEW: u64 = 300;
const FLOOD_KEY: &str = "flood-key";
const LIGHT_KEY: &str = "light-key";
const VIP_KEY: &str = "vip-key";

/// An engine whose answers take `hold` before their first token (one at a time fits).
async fn engine_holding(hold: Duration) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: KV as usize,
        context_length: WINDOW as usize,
        first_token_latency: hold,
        token_latency: Duration::from_millis(1),
        ..SimConfig::default()
    })
    .await
}

/// One pool on `engine`, tenants flood, light and vip (vip may ask for `critical`), and
/// `scheduling` lines for `[scheduling]`.
async fn gateway_on(engine: &RunningSim, scheduling: &str) -> RunningGateway {
    let text = config_with_pools(WINDOW, &unified_pool("p", &[worker(engine, Some(KV))])).replace(
        "[audit]\n",
        &format!("[scheduling]\n{scheduling}\n\n[audit]\n"),
    );
    let tenants = [
        tenant_table("flood", FLOOD_KEY),
        tenant_table("light", LIGHT_KEY),
        tenant_table("vip", VIP_KEY) + "max_priority = \"critical\"\n",
    ]
    .join("\n");
    gateway(&format!("{text}\n{tenants}")).await
}

fn body() -> Value {
    json!({"text": "Summarise the history of the printing press in Europe, from Gutenberg's workshop in Mainz to the spread of presses across the continent.",
        "sampling_params": {"max_new_tokens": MAX_NEW}})
}

/// Send one request; returns the reply and its place in the order answers completed.
async fn send_one(
    gw: &RunningGateway,
    key: &'static str,
    headers: Vec<(&'static str, &'static str)>,
    done: Arc<AtomicUsize>,
) -> (Reply, usize) {
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = post_with(&url, Some(key), &headers, &body()).await;
    (reply, done.fetch_add(1, Ordering::SeqCst))
}

/// Wait (bounded) until a request holds the worker's KV (it was routed and runs).
async fn holding(gw: &RunningGateway) {
    for _ in 0..1000 {
        if gw.fleet().workers().any(|w| w.kv_in_flight() > 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no request ever held the worker");
}

/// Wait (bounded) until `n` requests wait in pool `p`'s queue.
async fn queued(gw: &RunningGateway, n: usize) {
    for _ in 0..1000 {
        if gw.fleet().pool("p").map(|p| p.queue.len()) == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the queue never held {n}: {:?}",
        gw.fleet().pool("p").map(|p| p.queue.snapshot())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_light_tenant_is_served_before_a_flooding_tenants_backlog() {
    let engine = engine_holding(Duration::from_millis(300)).await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    let done = Arc::new(AtomicUsize::new(0));
    let mut flood = Vec::new();
    for i in 0..5 {
        let (g, d) = (gw.clone(), done.clone());
        flood.push(tokio::spawn(async move {
            send_one(&g, FLOOD_KEY, vec![], d).await
        }));
        // The first runs; the others queue in the order they were sent.
        if i == 0 {
            holding(&gw).await;
        } else {
            queued(&gw, i).await;
        }
    }
    queued(&gw, 4).await;
    let (light, light_place) = send_one(&gw, LIGHT_KEY, vec![], done.clone()).await;
    assert_eq!(light.status, 200, "{}", light.text());
    assert!(
        light.headers.contains_key("x-kvgate-queued-ms"),
        "a queued answer says how long it waited: {:?}",
        light.headers
    );
    let mut flood_places = Vec::new();
    for f in flood {
        let (reply, place) = f.await.expect("flood request");
        assert_eq!(reply.status, 200, "{}", reply.text());
        flood_places.push(place);
    }
    let after_light = flood_places.iter().filter(|&&p| p > light_place).count();
    assert!(
        after_light >= 3,
        "the light request (done {light_place}) waits behind at most the running and the first queued flood request: flood done at {flood_places:?}"
    );
    let stats = engine.engine.stats();
    assert!(stats.peak_kv_tokens <= KV, "{stats:?}");
    assert_eq!(stats.queued, 0, "the engine never queued: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_critical_request_is_never_served_after_a_sheddable_one() {
    let engine = engine_holding(Duration::from_millis(300)).await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    let done = Arc::new(AtomicUsize::new(0));
    let running = {
        let (gw, done) = (gw.clone(), done.clone());
        tokio::spawn(async move { send_one(&gw, VIP_KEY, vec![], done).await })
    };
    holding(&gw).await;
    let mut sheddable = Vec::new();
    for n in 1..=3 {
        let (g, d) = (gw.clone(), done.clone());
        sheddable.push(tokio::spawn(async move {
            send_one(&g, VIP_KEY, vec![("x-kvgate-priority", "sheddable")], d).await
        }));
        queued(&gw, n).await;
    }
    let (critical, critical_place) = send_one(
        &gw,
        VIP_KEY,
        vec![("x-kvgate-priority", "critical")],
        done.clone(),
    )
    .await;
    assert_eq!(critical.status, 200, "{}", critical.text());
    for s in sheddable {
        let (reply, place) = s.await.expect("sheddable request");
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(
            place > critical_place,
            "a sheddable request (done {place}) went before the critical one ({critical_place})"
        );
    }
    assert_eq!(running.await.expect("first").0.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_or_sheds_and_a_deadline_refuses_with_retry_after() {
    // The running request holds the worker far longer than the queue's deadline.
    let engine = engine_holding(Duration::from_secs(4)).await;
    let gw = Arc::new(gateway_on(&engine, "max_queued = 2\nqueue_timeout = \"1500ms\"").await);
    let done = Arc::new(AtomicUsize::new(0));
    let spawn = |key: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let (gw, done) = (gw.clone(), done.clone());
        tokio::spawn(async move { send_one(&gw, key, headers, done).await })
    };
    let running = spawn(FLOOD_KEY, vec![]);
    holding(&gw).await;
    let first = spawn(FLOOD_KEY, vec![]);
    queued(&gw, 1).await;
    let second = spawn(FLOOD_KEY, vec![]);
    queued(&gw, 2).await;

    // Full of the flood's own requests: its next one is refused at once.
    let (full, _) = send_one(&gw, FLOOD_KEY, vec![], done.clone()).await;
    assert_eq!(full.status, 503, "{}", full.text());
    assert_eq!(error_code(&full), "overloaded");
    assert!(
        error_message(&full).contains("queue is full"),
        "{}",
        full.text()
    );
    assert!(
        full.headers.contains_key("retry-after"),
        "{:?}",
        full.headers
    );

    // Another tenant's request takes the place of the flood's newest, which is shed.
    let light = spawn(LIGHT_KEY, vec![]);
    let (shed, _) = second.await.expect("second");
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert!(error_message(&shed).contains("shed"), "{}", shed.text());
    assert!(
        shed.headers.contains_key("retry-after"),
        "{:?}",
        shed.headers
    );

    // A critical request sheds the newest standard one (the light tenant's).
    let critical = spawn(VIP_KEY, vec![("x-kvgate-priority", "critical")]);
    let (shed, _) = light.await.expect("light");
    assert_eq!(shed.status, 503, "{}", shed.text());
    assert!(error_message(&shed).contains("shed"), "{}", shed.text());

    // The others wait until their deadline: refused, with a Retry-After of whole seconds.
    for waiting in [first, critical] {
        let (reply, _) = waiting.await.expect("waiting request");
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert!(
            error_message(&reply).contains("deadline"),
            "{}",
            reply.text()
        );
        let retry: u64 = reply.headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("seconds");
        assert!(retry >= 1, "{retry}");
    }
    assert_eq!(running.await.expect("running").0.status, 200);
    let reasons: Vec<String> = gw
        .audit()
        .recent()
        .iter()
        .filter(|l| l["event"] == "queue_refused")
        .map(|l| l["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    for reason in ["full", "shed", "timed_out"] {
        assert!(reasons.iter().any(|r| r == reason), "{reason}: {reasons:?}");
    }
    assert!(gw.fleet().pool("p").map(|p| p.queue.is_empty()) == Some(true));
}

/// `n` requests from two tenants at once; their statuses.
async fn burst(gw: &Arc<RunningGateway>, n: usize) -> Vec<u16> {
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (gw, done) = (gw.clone(), done.clone());
            let key = if i % 2 == 0 { FLOOD_KEY } else { LIGHT_KEY };
            tokio::spawn(async move { send_one(&gw, key, vec![], done).await.0.status.as_u16() })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.expect("request"));
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_keeps_the_engine_within_its_pool_and_off_leaves_the_queueing_to_the_engine() {
    let on_engine = engine_holding(Duration::from_millis(150)).await;
    let on = Arc::new(gateway_on(&on_engine, "").await);
    assert_eq!(burst(&on, 8).await, vec![200; 8]);
    let stats = on_engine.engine.stats();
    assert!(stats.peak_kv_tokens <= KV, "{stats:?}");
    assert_eq!(stats.peak_running, 1, "{stats:?}");
    assert_eq!(
        stats.queued, 0,
        "the gateway held them, not the engine: {stats:?}"
    );

    let off_engine = engine_holding(Duration::from_millis(150)).await;
    let off = Arc::new(gateway_on(&off_engine, "enabled = false").await);
    assert_eq!(burst(&off, 8).await, vec![200; 8]);
    let stats = off_engine.engine.stats();
    assert!(
        stats.queued > 0,
        "without the queue the engine queues: {stats:?}"
    );
}
