//! Saturation over real sockets: a running batch bounded by the KV pool (and optionally by
//! `max_running_requests`), a first-come-first-served waiting queue, the load endpoints that
//! report both, and a prefill time that grows with the prompt.
//!
//! No test reads a clock for a threshold: order comes from the engine's admission log and
//! from which stream's first token arrived first; waits are bounded only to fail, not to pass.

mod support;

use std::time::Instant;

use serde_json::{json, Value};
use support::*;

/// Bounds every wait for the engine: reached only when something is broken.
const PATIENCE: Duration = Duration::from_secs(30);

/// A small pool (256 tokens, 16 pages of 16) and a slow pace: a request holds its pages for
/// a while, and the queue waits much longer than the default 5 s would allow.
fn small_pool() -> SimConfig {
    SimConfig {
        kv_tokens: 256,
        page_size: 16,
        token_latency: Duration::from_millis(25),
        bootstrap_timeout: Duration::from_secs(60),
        ..config(SimRole::Unified)
    }
}

/// A `/generate` body of `prompt` distinct token ids asking for `max_new` tokens.
fn generate(rid: &str, prompt: usize, max_new: usize, stream: bool) -> Value {
    let ids: Vec<u32> = (0..prompt as u32).map(|i| 1000 + i).collect();
    json!({
        "rid": rid,
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0},
        "stream": stream,
    })
}

/// Sends `body` in the background once the engine has scheduled `before` requests, and
/// returns after the engine scheduled this one too: requests arrive in the order they are
/// sent, whatever the client's connection pool does.
async fn send_in_order(
    sim: &RunningSim,
    before: u64,
    body: Value,
) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let addr = sim.http_addr;
    let task = tokio::spawn(async move { post(addr, "/generate", &body).await });
    sim.engine
        .wait_for_stats(PATIENCE, |s| s.scheduled > before)
        .await
        .expect("the engine schedules the request");
    task
}

/// The value of the one sample of `name` in a Prometheus text body.
fn gauge(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn metrics(addr: SocketAddr) -> String {
    let (status, bytes) = send(addr, Method::GET, "/metrics", Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn saturated_requests_wait_in_fifo_order_and_all_finish() {
    let sim = start(small_pool()).await;
    // Two requests of 100 KV tokens (7 pages each) fill 14 of 16 pages. Then a large one of
    // 200 (13 pages) must wait, and two small ones of 32 (2 pages) that would fit the 2 free
    // pages must wait behind it: first come, first served, so the large one is not starved.
    let plan = [
        ("a", 60, 40),
        ("b", 60, 40),
        ("large", 150, 50),
        ("small-1", 20, 12),
        ("small-2", 20, 12),
    ];
    let mut tasks = Vec::new();
    for (i, (rid, prompt, max_new)) in plan.into_iter().enumerate() {
        let body = generate(rid, prompt, max_new, false);
        tasks.push(send_in_order(&sim, i as u64, body).await);
    }

    // While the large request waits, every load endpoint shows the queue.
    let (status, loads) = get(sim.http_addr, "/v1/loads").await;
    assert_eq!(status, StatusCode::OK);
    let waiting = loads["num_waiting_reqs"].as_u64().unwrap();
    let running = loads["num_running_reqs"].as_u64().unwrap();
    assert!(waiting > 0, "{loads}");
    assert!(running > 0, "{loads}");
    assert_eq!(loads["max_total_num_tokens"], 256);
    let used = loads["num_used_tokens"].as_u64().unwrap();
    assert!(used <= 256, "{loads}");
    assert_eq!(
        loads["loads"][0]["num_waiting_reqs"],
        loads["num_waiting_reqs"]
    );
    assert_eq!(loads["dp_rank"], 0);
    let usage = loads["token_usage"].as_f64().unwrap();
    assert!((usage - used as f64 / 256.0).abs() < 1e-3, "{loads}");

    let (status, get_load) = get(sim.http_addr, "/get_load").await;
    assert_eq!(status, StatusCode::OK);
    let rank = &get_load[0];
    assert_eq!(rank["dp_rank"], 0);
    let num_waiting = rank["num_waiting_reqs"].as_u64().unwrap();
    assert!(num_waiting > 0, "{get_load}");
    assert!(
        rank["num_reqs"].as_u64().unwrap() > num_waiting,
        "{get_load}"
    );
    // Tokens in use plus the waiting prompts, each of which has at least 20 tokens.
    assert!(
        rank["num_tokens"].as_u64().unwrap() >= 20 * num_waiting,
        "{get_load}"
    );

    let text = metrics(sim.http_addr).await;
    assert!(gauge(&text, "sglang:num_queue_reqs") > 0.0, "{text}");
    assert!(gauge(&text, "sglang:num_running_reqs") > 0.0, "{text}");
    assert_eq!(gauge(&text, "sglang:max_total_num_tokens"), 256.0);
    assert!(gauge(&text, "sglang:num_used_tokens") <= 256.0, "{text}");
    let usage = gauge(&text, "sglang:token_usage");
    assert!((0.0..=1.0).contains(&usage), "{text}");
    assert!(
        text.contains(&format!(
            "sglang:num_queue_reqs{{model_name=\"{MODEL}\",engine_type=\"unified\""
        )),
        "{text}"
    );
    assert!(
        text.contains("# TYPE sglang:num_running_reqs gauge"),
        "{text}"
    );

    // Everyone finishes, successfully, having entered the batch in arrival order.
    for ((rid, _, max_new), task) in plan.into_iter().zip(tasks) {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{rid}: {body}");
        assert_eq!(body["meta_info"]["id"], rid);
        assert_eq!(body["meta_info"]["completion_tokens"], max_new, "{body}");
        assert_eq!(body["meta_info"]["finish_reason"]["type"], "length");
    }
    assert_eq!(
        sim.engine.admissions(),
        ["a", "b", "large", "small-1", "small-2"]
    );
    let stats = sim.engine.stats();
    assert!(stats.queued >= 3, "{stats:?}");
    assert!(stats.peak_waiting >= 3, "{stats:?}");
    // The running batch never held more KV than the pool.
    assert!(stats.peak_kv_tokens <= 256, "{stats:?}");
    assert!(stats.peak_kv_tokens >= 14 * 16, "{stats:?}");
    assert_eq!((stats.running_reqs, stats.waiting_reqs), (0, 0));
    assert_eq!(sim.engine.used_kv_tokens(), 0);
    let (_, loads) = get(sim.http_addr, "/v1/loads").await;
    assert_eq!(loads["num_waiting_reqs"], 0);
    assert_eq!(loads["num_running_reqs"], 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn max_running_requests_bounds_the_batch() {
    // The pool holds all of them; only the batch limit makes them wait.
    let sim = start(SimConfig {
        kv_tokens: 4096,
        max_running_requests: std::num::NonZeroUsize::new(2),
        ..small_pool()
    })
    .await;
    let rids = ["r0", "r1", "r2", "r3", "r4"];
    let mut tasks = Vec::new();
    for (i, rid) in rids.into_iter().enumerate() {
        tasks.push(send_in_order(&sim, i as u64, generate(rid, 20, 12, false)).await);
    }
    let (_, loads) = get(sim.http_addr, "/v1/loads").await;
    assert!(loads["num_running_reqs"].as_u64().unwrap() <= 2, "{loads}");
    assert!(loads["num_waiting_reqs"].as_u64().unwrap() > 0, "{loads}");
    assert_eq!(loads["max_running_requests"], 2);
    let text = metrics(sim.http_addr).await;
    assert!(gauge(&text, "sglang:num_running_reqs") <= 2.0, "{text}");
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let stats = sim.engine.stats();
    assert_eq!(stats.peak_running, 2, "{stats:?}");
    assert!(stats.queued >= 1, "{stats:?}");
    assert_eq!(sim.engine.admissions(), rids);
    sim.shutdown().await;
}

/// Streams `body` and returns when its first event (the first token) arrived, and its status.
async fn first_token_at(addr: SocketAddr, body: Value) -> (StatusCode, Instant) {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}/generate"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status();
    let mut body = resp.into_body();
    let frame = body.frame().await.expect("a first event").unwrap();
    let at = Instant::now();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    assert!(text.starts_with("data: {"), "{text}");
    // Read the rest, so the stream ends normally.
    while body.frame().await.is_some() {}
    (status, at)
}

#[tokio::test]
async fn a_longer_prompt_waits_longer_for_its_first_token() {
    // 1 ms of prefill per prompt token: 2000 tokens take 2 s before their first token, 10
    // tokens 10 ms. Both fit the batch at once, so only the prefill tells them apart.
    let sim = start(SimConfig {
        kv_tokens: 8192,
        context_length: 8192,
        token_latency: Duration::from_millis(1),
        prefill_token_latency: Duration::from_millis(1),
        ..config(SimRole::Unified)
    })
    .await;
    let addr = sim.http_addr;
    let long = tokio::spawn(first_token_at(addr, generate("long", 2000, 4, true)));
    sim.engine
        .wait_for_stats(PATIENCE, |s| s.admitted == 1)
        .await
        .expect("the long prompt is admitted first");
    let (status, short_at) = first_token_at(addr, generate("short", 10, 4, true)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, long_at) = long.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    // Admitted first, yet its first token comes after the short prompt's.
    assert_eq!(sim.engine.admissions(), ["long", "short"]);
    assert!(
        long_at > short_at,
        "the long prompt's prefill took no longer"
    );
    sim.shutdown().await;
}
