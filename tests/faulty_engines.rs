//! Faulty engines cannot hold or fool the gateway: stalled streams end, PD failures come
//! back at once, connect failures are retried elsewhere, a garbage first event is a 502,
//! counters reconcile with what engines received, and limits count real tokens.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

fn with_upstream(text: String, upstream: &str) -> String {
    text.replace(
        "request_timeout = \"20s\"",
        &format!("request_timeout = \"20s\"\n{upstream}"),
    )
}

/// The sum of `kvgate_upstream_requests_total` for one pool and role.
fn upstream_count(pool: &str, role: &str) -> u64 {
    let text = kvgate::metrics::handle().render();
    text.lines()
        .filter(|l| l.starts_with("kvgate_upstream_requests_total{"))
        .filter(|l| {
            l.contains(&format!("pool=\"{pool}\"")) && l.contains(&format!("role=\"{role}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn story(stream: bool, max_new: u64) -> Value {
    json!({"text": "a long story ".repeat(50), "stream": stream,
           "sampling_params": {"max_new_tokens": max_new}})
}

#[tokio::test]
async fn a_stalled_stream_ends_with_an_error_event_and_frees_its_slots() {
    let engine = engine(
        SimRole::Unified,
        SimFault::StallStream,
        40960,
        WINDOW as usize,
    )
    .await;
    let text = with_upstream(
        config_with_pools(WINDOW, &unified_pool("stall", &[worker(&engine, None)])),
        "stream_idle_timeout = \"1s\"",
    )
    .replace("name = \"t1\"", "name = \"t1\"\nmax_concurrent = 1");
    let gw = gateway(&text).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        post(&url, Some(KEY), &story(true, 20)),
    )
    .await
    .expect("the stalled stream ended");
    assert_eq!(
        reply.status,
        200,
        "the stream had started: {}",
        reply.text()
    );
    let events = reply.sse_data();
    assert!(!events.iter().any(|e| e == "[DONE]"), "{events:?}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_timeout", "{last}");
    // The tenant's single slot and the worker's load are back: a non-streamed request
    // (which this engine answers normally) passes.
    assert!(gw.fleet().workers().all(|w| w.outstanding() == 0));
    let next = post(&url, Some(KEY), &story(false, 2)).await;
    assert_eq!(next.status, 200, "{}", next.text());
    gw.shutdown().await;
}

#[tokio::test]
async fn a_failed_prefill_fails_the_request_at_once_and_cancels_the_decode_leg() {
    // The decode worker never answers; the prefill worker drops the connection at once.
    let prefill = engine(SimRole::Prefill, SimFault::Reset, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::Hang, 40960, WINDOW as usize).await;
    let pools = pd_pool(
        "pdfast",
        &[worker(&prefill, None)],
        &[worker(&decode, None)],
    );
    // request_timeout is 20 s: waiting for the decode leg would take that long.
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        post(&url, Some(KEY), &story(false, 4)),
    )
    .await
    .expect("the prefill failure came back without waiting for decode");
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert!(gw.fleet().workers().all(|w| w.outstanding() == 0));
    assert_eq!(upstream_count("pdfast", "prefill"), 1);
    assert_eq!(
        upstream_count("pdfast", "decode"),
        1,
        "the cancelled leg counts once"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_failed_decode_fails_the_request_at_once_and_cancels_the_prefill_leg() {
    let prefill = engine(SimRole::Prefill, SimFault::Hang, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::Reset, 40960, WINDOW as usize).await;
    let pools = pd_pool(
        "pdfast2",
        &[worker(&prefill, None)],
        &[worker(&decode, None)],
    );
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    for stream in [false, true] {
        let reply = tokio::time::timeout(
            Duration::from_secs(10),
            post(&url, Some(KEY), &story(stream, 4)),
        )
        .await
        .expect("the decode failure came back without waiting for prefill");
        assert_eq!(reply.status, 502, "{}", reply.text());
    }
    assert!(gw.fleet().workers().all(|w| w.outstanding() == 0));
    assert_eq!(
        upstream_count("pdfast2", "prefill"),
        2,
        "cancelled legs count once"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn engines_that_never_answer_or_never_stop_hit_their_deadlines() {
    // No response headers for a stream: 504 after response_header_timeout.
    let hang = engine(SimRole::Unified, SimFault::Hang, 40960, WINDOW as usize).await;
    let gw = gateway(&with_upstream(
        config_with_pools(WINDOW, &unified_pool("hang", &[worker(&hang, None)])),
        "response_header_timeout = \"1s\"",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = post(&url, Some(KEY), &story(true, 4)).await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (504, "upstream_timeout")
    );
    gw.shutdown().await;

    // A stream that keeps going past the whole-request cap ends with the error event.
    let slow = slow_engine(WINDOW as usize, 100).await;
    let text = config_with_pools(WINDOW, &unified_pool("slowcap", &[worker(&slow, None)]))
        .replace("request_timeout = \"20s\"", "request_timeout = \"1s\"");
    let gw = gateway(&text).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = post(&url, Some(KEY), &story(true, 100)).await;
    assert_eq!(reply.status, 200);
    let events = reply.sse_data();
    assert!(!events.iter().any(|e| e == "[DONE]"));
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_timeout", "{last}");
    assert!(gw.fleet().workers().all(|w| w.outstanding() == 0));
    gw.shutdown().await;
}

#[tokio::test]
async fn an_answer_over_max_response_bytes_is_a_502() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&with_upstream(
        config_with_pools(WINDOW, &unified_pool("big", &[worker(&engine, None)])),
        "max_response_bytes = \"1KiB\"",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    // The engine echoes the prompt: 2.6 KB of text comes back.
    let big =
        json!({"text": "a long story ".repeat(200), "sampling_params": {"max_new_tokens": 600}});
    let reply = post(&url, Some(KEY), &big).await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (502, "upstream_protocol_error"),
        "{}",
        reply.text()
    );
    let small = post(&url, Some(KEY), &story(false, 2)).await;
    assert_eq!(small.status, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_connect_failure_is_retried_on_another_worker() {
    let live = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let dead = {
        let l = bind().await;
        l.local_addr().unwrap()
    }; // closed: connecting is refused
    let dead_worker = format!("{{ url = \"http://{dead}\", kv_tokens = 40960 }}");
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("retry", &[dead_worker, worker(&live, None)]),
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    for _ in 0..4 {
        let reply = post(&url, Some(KEY), &story(false, 2)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(generations(&live).len(), 4);
    let metrics = kvgate::metrics::handle().render();
    assert!(
        metrics
            .lines()
            .any(|l| l
                .starts_with("kvgate_upstream_retries_total{pool=\"retry\",reason=\"connect\"}")),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_non_json_first_event_is_a_502_before_the_200() {
    let engine = engine(
        SimRole::Unified,
        SimFault::GarbageEvent,
        40960,
        WINDOW as usize,
    )
    .await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("garbage", &[worker(&engine, None)]),
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    let reply = post(&url, Some(KEY), &story(true, 4)).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(error_code(&reply), "upstream_protocol_error");
    gw.shutdown().await;
}

#[tokio::test]
async fn upstream_counters_reconcile_with_what_the_engines_received() {
    let faults = [
        SimFault::None,
        SimFault::Reset,
        SimFault::ErrorEvent,
        SimFault::AbortNoStatus,
        SimFault::WrongPromptTokens,
        SimFault::CutStream,
        SimFault::GarbageEvent,
    ];
    let mut engines = Vec::new();
    let mut pools = String::new();
    for (i, fault) in faults.iter().enumerate() {
        let e = engine(SimRole::Unified, *fault, 40960, WINDOW as usize).await;
        pools.push_str(&unified_pool(&format!("rec{i}"), &[worker(&e, None)]));
        pools.push_str("weight = 1\n");
        engines.push(e);
    }
    let prefill = engine(
        SimRole::Prefill,
        SimFault::PrefillAbort,
        40960,
        WINDOW as usize,
    )
    .await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    pools.push_str(&pd_pool(
        "recpd",
        &[worker(&prefill, None)],
        &[worker(&decode, None)],
    ));
    pools.push_str("weight = 1\n");
    // Anonymous traffic is split request by request (a tenant would stick to one pool),
    // so every pool gets its share.
    let config = config_with_pools(WINDOW, &pools)
        .replace("[server]\n", "[server]\nallow_anonymous = true\n");
    let gw = gateway(&config).await;
    let url = format!("http://{}/generate", gw.data_addr());
    for i in 0..32 {
        let _ = post(&url, None, &story(i % 2 == 0, 3)).await;
    }
    for (i, e) in engines.iter().enumerate() {
        assert_eq!(
            upstream_count(&format!("rec{i}"), "unified"),
            generations(e).len() as u64,
            "pool rec{i} ({:?})",
            faults[i]
        );
    }
    assert_eq!(
        upstream_count("recpd", "prefill"),
        generations(&prefill).len() as u64
    );
    assert_eq!(
        upstream_count("recpd", "decode"),
        generations(&decode).len() as u64
    );
    assert!(
        generations(&decode).len() >= 3,
        "the PD pool took its share"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn limits_count_real_tokens() {
    // Prefill KV 8,192 and decode KV 4,096: the decode worker's own input limit binds.
    let prefill = engine(SimRole::Prefill, SimFault::None, 8192, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 4096, WINDOW as usize).await;
    let pools = pd_pool("real", &[worker(&prefill, None)], &[worker(&decode, None)]);
    let text = config_with_pools(WINDOW, &pools)
        .replace("name = \"t1\"", "name = \"t1\"\ntokens_per_minute = 20000");
    let gw = gateway(&text).await;
    let base = format!("http://{}", gw.data_addr());
    let tk = qwen3();

    // A 4,090-token prompt reaches neither leg: 400 context_length_exceeded.
    let reply = post(
        &format!("{base}/generate"),
        Some(KEY),
        &json!({"input_ids": vec![1u32; 4090], "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(
        error_code(&reply),
        "context_length_exceeded",
        "{}",
        reply.text()
    );
    assert!(reply.text().contains("decode workers"), "{}", reply.text());
    assert!(generations(&prefill).is_empty() && generations(&decode).is_empty());

    // A 7,150-byte chat with max_tokens 16 against 20,000 tokens per minute: admitted, and
    // the reservation is its exact count, not its byte bound.
    let content = "The quick brown fox jumps over the lazy dog. ".repeat(160);
    let messages = json!([{"role": "user", "content": content}]);
    let rendered = tk.apply_chat_template(&messages, None, true).unwrap();
    let exact = tk.count(&rendered, false).unwrap() as u64;
    let chat = json!({"model": "qwen3", "max_tokens": 16, "messages": messages});
    let reply = post(&format!("{base}/v1/chat/completions"), Some(KEY), &chat).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let remaining: u64 = reply.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(remaining, 20_000 - (exact + 16), "exact count {exact}");

    // A text prompt reserves its exact count too.
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(40);
    let exact_text = tk.count(&prompt, true).unwrap() as u64;
    let completion = json!({"model": "qwen3", "max_tokens": 8, "prompt": prompt});
    let reply = post(&format!("{base}/v1/completions"), Some(KEY), &completion).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let now: u64 = reply.headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        now <= remaining - (exact_text + 8) + 100
            && now >= remaining.saturating_sub(exact_text + 8) - 100,
        "reserved about {} (exact {exact_text} + 8): {remaining} → {now}",
        remaining - now
    );

    // A chat without max_tokens is clamped to what the decode pool leaves, and told so.
    let short = json!({"model": "qwen3", "messages": [{"role": "user", "content": "hello there"}]});
    let reply = post(&format!("{base}/v1/chat/completions"), Some(KEY), &short).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let clamped: u64 = reply.headers["x-kvgate-max-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let prompt = reply.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(clamped, 4096 - prompt);
    let sent = generations(&decode);
    assert_eq!(sent.last().unwrap().body["max_tokens"], clamped);
    // With n = 4 every sequence gets a quarter of that room.
    let four =
        json!({"model": "qwen3", "n": 4, "messages": [{"role": "user", "content": "hello there"}]});
    let reply = post(&format!("{base}/v1/chat/completions"), Some(KEY), &four).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.headers["x-kvgate-max-tokens"],
        ((4096 - prompt) / 4).to_string().as_str()
    );

    // An over-long text prompt reports its exact count.
    let long = "word ".repeat(5000);
    let count = tk.count(&long, true).unwrap();
    let reply = post(
        &format!("{base}/generate"),
        Some(KEY),
        &json!({"text": long}),
    )
    .await;
    assert_eq!(error_code(&reply), "context_length_exceeded");
    assert!(
        error_message(&reply).contains(&format!("has {count} tokens")),
        "{}",
        reply.text()
    );
    gw.shutdown().await;
}
