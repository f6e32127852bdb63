//! Running slots as a capacity of their own (issue 38): an engine that runs at most N
//! requests at once (SGLang's `--max-running-requests`) with plenty of KV. kvgate sends it
//! no more than N, so the rest wait in kvgate's fair queue (where a light tenant goes
//! ahead) instead of the engine's FIFO. Order is checked by the order answers complete,
//! never by clocks.
//!
//! - the slots the engine reports (`/get_server_info`, `/v1/loads`) bound what kvgate sends,
//!   and a light tenant is served before a flooding tenant's backlog;
//! - `max_running` in the config bounds an engine that says nothing;
//! - requests another front door sent straight to the engine take their slots too;
//! - a tenant arriving while a flood is on (no history) starts at once, on the spare room
//!   kept for newcomers, instead of after the next wave of answers.

mod support;

use serde_json::{json, Value};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 4096;
/// Room for dozens of these requests: KV never binds here.
const KV: usize = 40960;
const FLOOD_KEY: &str = "flood-key";
const LIGHT_KEY: &str = "light-key";

/// An engine running at most `slots` requests at once (None: unbounded), each answer
/// taking `hold` before its first token.
async fn engine_running(slots: Option<usize>, hold: Duration) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: KV,
        context_length: WINDOW as usize,
        first_token_latency: hold,
        token_latency: Duration::from_millis(1),
        max_running_requests: slots.and_then(NonZeroUsize::new),
        ..SimConfig::default()
    })
    .await
}

/// One pool on `engine` (`pool_extra` lines added to it), tenants flood and light, load
/// reports polled every 100 ms.
async fn gateway_on(engine: &RunningSim, pool_extra: &str) -> RunningGateway {
    let pool = format!("{}{pool_extra}", unified_pool("p", &[worker(engine, None)]));
    let text = config_with_pools(WINDOW, &pool).replace(
        "[audit]\n",
        "[health]\ninterval = \"100ms\"\ntimeout = \"100ms\"\n\n[audit]\n",
    );
    let tenants = [
        tenant_table("flood", FLOOD_KEY),
        tenant_table("light", LIGHT_KEY),
    ]
    .join("\n");
    gateway(&format!("{text}\n{tenants}")).await
}

fn body() -> Value {
    json!({"text": "Summarise the history of the printing press in Europe.",
        "sampling_params": {"max_new_tokens": 8}})
}

/// Send one request; returns the reply and its place in the order answers completed.
async fn send_one(
    gw: &RunningGateway,
    key: &'static str,
    done: Arc<AtomicUsize>,
) -> (Reply, usize) {
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = post(&url, Some(key), &body()).await;
    (reply, done.fetch_add(1, Ordering::SeqCst))
}

/// Wait (bounded) until `check` holds.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

fn queued(gw: &RunningGateway) -> usize {
    gw.fleet().pool("p").map_or(0, |p| p.queue.len())
}

fn outstanding(gw: &RunningGateway) -> usize {
    gw.fleet().workers().map(|w| w.outstanding()).sum()
}

/// `n` flood requests: the first `running` run, the others queue in kvgate in the order
/// they were sent.
async fn flood(
    gw: &Arc<RunningGateway>,
    n: usize,
    running: usize,
    done: &Arc<AtomicUsize>,
) -> Vec<tokio::task::JoinHandle<(Reply, usize)>> {
    let mut flood = Vec::new();
    for i in 0..n {
        let (g, d) = (gw.clone(), done.clone());
        flood.push(tokio::spawn(
            async move { send_one(&g, FLOOD_KEY, d).await },
        ));
        if i < running {
            until("the flood's first requests run", || {
                outstanding(gw) == i + 1
            })
            .await;
        } else {
            until("the flood's rest queues in kvgate", || {
                queued(gw) == i + 1 - running
            })
            .await;
        }
    }
    flood
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_bound_engine_gets_what_it_runs_and_a_light_tenant_goes_first() {
    let engine = engine_running(Some(2), Duration::from_millis(600)).await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    // What the engine said of itself at discovery.
    let worker = gw.fleet().workers().next().cloned().expect("a worker");
    assert_eq!(worker.max_running(), Some(2));
    let done = Arc::new(AtomicUsize::new(0));
    let flood = flood(&gw, 6, 2, &done).await;
    let (light, light_place) = send_one(&gw, LIGHT_KEY, done.clone()).await;
    assert_eq!(light.status, 200, "{}", light.text());
    let mut flood_places = Vec::new();
    for f in flood {
        let (reply, place) = f.await.expect("flood request");
        assert_eq!(reply.status, 200, "{}", reply.text());
        flood_places.push(place);
    }
    let after_light = flood_places.iter().filter(|&&p| p > light_place).count();
    assert!(
        after_light >= 3,
        "the light request (done {light_place}) waits behind at most the running flood requests and the next: flood done at {flood_places:?}"
    );
    let stats = engine.engine.stats();
    assert_eq!(stats.peak_running, 2, "{stats:?}");
    assert_eq!(stats.queued, 0, "the engine never queued: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_running_in_the_config_bounds_an_engine_that_says_nothing() {
    // The engine itself would run them all at once.
    let engine = engine_running(None, Duration::from_millis(600)).await;
    let gw = Arc::new(gateway_on(&engine, "max_running = 3\n").await);
    let done = Arc::new(AtomicUsize::new(0));
    let flood = flood(&gw, 5, 3, &done).await;
    for f in flood {
        assert_eq!(f.await.expect("flood request").0.status, 200);
    }
    let stats = engine.engine.stats();
    assert_eq!(stats.peak_running, 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_another_front_door_sent_take_their_slots_too() {
    let engine = engine_running(Some(2), Duration::from_millis(600)).await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    // Two long requests straight to the engine: both of its slots.
    let direct = format!("http://{}/generate", engine.http_addr);
    let around: Vec<_> = (0..2)
        .map(|_| {
            let url = direct.clone();
            tokio::spawn(async move { post(&url, None, &body()).await })
        })
        .collect();
    let worker = gw.fleet().workers().next().cloned().expect("a worker");
    until("kvgate's load poll sees the engine's two requests", || {
        worker
            .engine_load()
            .is_some_and(|l| l.foreign_requests == 2)
    })
    .await;
    let done = Arc::new(AtomicUsize::new(0));
    let (g, d) = (gw.clone(), done.clone());
    let ours = tokio::spawn(async move { send_one(&g, LIGHT_KEY, d).await });
    until("kvgate's request waits in kvgate", || queued(&gw) == 1).await;
    for a in around {
        assert_eq!(a.await.expect("direct request").status, 200);
    }
    let (reply, _) = ours.await.expect("our request");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let stats = engine.engine.stats();
    assert_eq!(
        stats.queued, 0,
        "the engine never queued kvgate's request: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_shutdown_queued_requests_get_503_at_once_and_the_running_one_finishes() {
    let engine = engine_running(Some(1), Duration::from_millis(1500)).await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    let done = Arc::new(AtomicUsize::new(0));
    let flood = flood(&gw, 4, 1, &done).await;
    gw.begin_shutdown();
    let mut answers = Vec::new();
    for f in flood {
        answers.push(f.await.expect("request"));
    }
    // The first runs to its end; the three queued are answered first, at once: 503 with
    // Retry-After (they never started: a retry elsewhere loses nothing).
    let (running, running_place) = &answers[0];
    assert_eq!(running.status, 200, "{}", running.text());
    assert_eq!(*running_place, 3, "the running request finishes last");
    for (reply, place) in &answers[1..] {
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert!(
            reply.headers.contains_key("retry-after"),
            "{:?}",
            reply.headers
        );
        assert!(reply.text().contains("shutting down"), "{}", reply.text());
        assert!(*place < 3);
    }
    assert_eq!(
        generations(&engine).len(),
        1,
        "nothing queued was dispatched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_under_an_ongoing_flood_starts_before_the_next_answer_ends() {
    // Ten slots; every answer takes about a second (8 tokens at 150 ms), so a flood's
    // answers end in waves about a second apart.
    let engine = engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: KV,
        context_length: WINDOW as usize,
        first_token_latency: Duration::from_millis(50),
        token_latency: Duration::from_millis(150),
        max_running_requests: NonZeroUsize::new(10),
        ..SimConfig::default()
    })
    .await;
    let gw = Arc::new(gateway_on(&engine, "").await);
    // The flood: 30 closed loops, 20 of them always waiting in kvgate's queue.
    let stop = Arc::new(AtomicBool::new(false));
    let ended: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let loops: Vec<_> = (0..30)
        .map(|_| {
            let (gw, stop, ended) = (gw.clone(), stop.clone(), ended.clone());
            tokio::spawn(async move {
                let url = format!("http://{}/generate", gw.data_addr());
                while !stop.load(Ordering::SeqCst) {
                    let reply = post(&url, Some(FLOOD_KEY), &body()).await;
                    assert_eq!(reply.status, 200, "{}", reply.text());
                    ended.lock().unwrap().push(Instant::now());
                }
            })
        })
        .collect();
    let answers = || ended.lock().unwrap().len();
    // An ongoing flood: a whole wave has ended and the next runs; then, just after the
    // next answer ends, the newcomer arrives: the one after is most of a wave away.
    until("the flood's first wave ends", || answers() >= 10).await;
    let seen = answers();
    until("the next answer ends", || answers() > seen).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let sent = Instant::now();
    let mut body = body();
    body["stream"] = json!(true);
    let response = send(request(
        http::Method::POST,
        &format!("http://{}/generate", gw.data_addr()),
        Some(LIGHT_KEY),
        body.to_string(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut stream = response.into_body();
    use http_body_util::BodyExt;
    let first_token = loop {
        let frame = stream
            .frame()
            .await
            .expect("the stream ends after its tokens")
            .expect("a frame");
        if frame
            .data_ref()
            .is_some_and(|d| String::from_utf8_lossy(d).contains("data:"))
        {
            break Instant::now();
        }
    };
    while stream.frame().await.is_some() {}
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        l.await.expect("flood loop");
    }
    let next_end = ended
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|&t| t > sent)
        .min()
        .expect("the flood answered after the newcomer arrived");
    assert!(
        first_token < next_end,
        "the newcomer's first token came {:?} after it was sent, {:?} after the next flood answer ended: it waited for room to free",
        first_token - sent,
        first_token.saturating_duration_since(next_end)
    );
    let stats = engine.engine.stats();
    assert!(stats.peak_running <= 10, "{stats:?}");
    assert_eq!(stats.queued, 0, "the engine never queued: {stats:?}");
}

/// One pool on `engine` with `tenants` (name, key) only (not the support config's `t1`).
async fn gateway_for(engine: &RunningSim, tenants: &[(&str, &str)]) -> RunningGateway {
    let pool = unified_pool("p", &[worker(engine, None)]);
    let tables: Vec<String> = tenants.iter().map(|(n, k)| tenant_table(n, k)).collect();
    let config = config_with_pools(WINDOW, &pool).replace(&tenant_table("t1", KEY), "");
    gateway(&format!("{config}\n{}", tables.join("\n"))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spare_room_for_newcomers_is_kept_only_where_another_tenant_may_come() {
    // With the flood's tenant alone in the config, no newcomer can come: it gets every slot.
    // With a second tenant configured (idle), one slot of ten stays spare for it.
    for (tenants, most) in [
        (&[("flood", FLOOD_KEY)][..], 10),
        (&[("flood", FLOOD_KEY), ("light", LIGHT_KEY)][..], 9),
    ] {
        let engine = engine_running(Some(10), Duration::from_millis(400)).await;
        let gw = Arc::new(gateway_for(&engine, tenants).await);
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(AtomicUsize::new(0));
        let loops: Vec<_> = (0..20)
            .map(|_| {
                let (gw, stop, answers) = (gw.clone(), stop.clone(), answers.clone());
                tokio::spawn(async move {
                    let url = format!("http://{}/generate", gw.data_addr());
                    while !stop.load(Ordering::SeqCst) {
                        let reply = post(&url, Some(FLOOD_KEY), &body()).await;
                        assert_eq!(reply.status, 200, "{}", reply.text());
                        answers.fetch_add(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        // Past the first wave (the first ten went before any tenant was over its share),
        // the most running at once for a second.
        until("the first wave ends", || {
            answers.load(Ordering::SeqCst) >= 10
        })
        .await;
        let mut seen = 0;
        for _ in 0..100 {
            seen = seen.max(outstanding(&gw));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for l in loops {
            l.await.expect("flood loop");
        }
        assert_eq!(seen, most, "{} tenant(s) configured", tenants.len());
    }
}
