//! End-to-end proxying through the gateway to simulated engines: unified and
//! prefill/decode pools, every endpoint, streaming and not, and the error paths.

mod support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

use kvgate_sim::{SimConfig, SimFault, SimRole};

const WINDOW: u64 = 32768;

fn bodies(stream: bool) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "qwen3", "stream": stream, "max_tokens": 8,
                   "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about the incident."}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "qwen3", "stream": stream, "max_tokens": 8, "prompt": "Once upon a time in a data centre"}),
        ),
        (
            "/generate",
            json!({"text": "The quick brown fox jumps over the lazy dog", "stream": stream,
                   "sampling_params": {"max_new_tokens": 8}}),
        ),
    ]
}

/// The generated text of a non-streaming answer, whichever API it came from.
fn answer_text(path: &str, v: &Value) -> String {
    let t = match path {
        "/v1/chat/completions" => &v["choices"][0]["message"]["content"],
        "/v1/completions" => &v["choices"][0]["text"],
        _ => &v["text"],
    };
    t.as_str().unwrap_or_default().to_owned()
}

async fn check_all_endpoints(base: &str, pool: &str) {
    for stream in [false, true] {
        for (path, body) in bodies(stream) {
            let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
            assert_eq!(
                reply.status,
                200,
                "{path} stream={stream}: {}",
                reply.text()
            );
            assert_eq!(reply.headers["x-kvgate-pool"], pool);
            if stream {
                assert!(reply.headers["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("text/event-stream"));
                let data = reply.sse_data();
                assert_eq!(
                    data.last().map(String::as_str),
                    Some("[DONE]"),
                    "{path}: {data:?}"
                );
                assert!(
                    data.len() >= 3,
                    "{path}: expected token events, got {data:?}"
                );
            } else {
                let v = reply.json();
                assert!(
                    !answer_text(path, &v).is_empty(),
                    "{path}: empty answer {v}"
                );
            }
        }
    }
}

#[tokio::test]
async fn unified_pool_serves_every_endpoint_streaming_and_not() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    check_all_endpoints(&format!("http://{}", gw.data_addr()), "u").await;
    assert_eq!(generations(&engine).len(), 6);
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_pool_serves_every_endpoint_and_both_sides_get_the_same_room() {
    let prefill = engine(SimRole::Prefill, SimFault::None, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    check_all_endpoints(&format!("http://{}", gw.data_addr()), "pd").await;

    let p = generations(&prefill);
    let d = generations(&decode);
    assert_eq!(p.len(), 6);
    assert_eq!(d.len(), 6);
    let bootstrap_port = prefill.bootstrap_addr.unwrap().port();
    for (p, d) in p.iter().zip(&d) {
        assert_eq!(p.path, d.path);
        assert_eq!(
            p.body["bootstrap_room"], d.body["bootstrap_room"],
            "same room on both sides"
        );
        assert!(p.body["bootstrap_room"].as_u64().is_some());
        assert_eq!(d.body["bootstrap_host"], "127.0.0.1");
        assert_eq!(d.body["bootstrap_port"], bootstrap_port);
    }
    let rooms: std::collections::HashSet<u64> = d
        .iter()
        .filter_map(|r| r.body["bootstrap_room"].as_u64())
        .collect();
    assert_eq!(rooms.len(), 6, "every request gets a fresh room");
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_batch_gets_one_room_per_sample_and_the_decode_answer() {
    let prefill = engine(SimRole::Prefill, SimFault::None, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool(
        "pd",
        &[worker(&prefill, Some(40960))],
        &[worker(&decode, Some(40960))],
    );
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let body = json!({"text": ["first prompt here", "second prompt, a bit longer than the first"],
                      "sampling_params": {"max_new_tokens": 4}});
    let reply = post(
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answers = reply.json();
    let answers = answers.as_array().expect("a batch answers with a list");
    assert_eq!(answers.len(), 2);
    for a in answers {
        // The prefill side answers with empty text and no completion tokens: this is decode's.
        assert!(
            a["meta_info"]["completion_tokens"].as_u64().unwrap() > 0,
            "{a}"
        );
        assert!(!a["text"].as_str().unwrap().is_empty());
    }
    let sent = &generations(&decode)[0].body;
    let rooms = sent["bootstrap_room"]
        .as_array()
        .expect("one room per sample");
    assert_eq!(rooms.len(), 2);
    assert_ne!(rooms[0], rooms[1]);
    assert_eq!(
        generations(&prefill)[0].body["bootstrap_room"],
        sent["bootstrap_room"]
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn bad_requests_get_openai_errors_and_never_reach_an_engine() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let mut text = config_with_pools(WINDOW, &unified_pool("u", &[worker(&engine, None)]));
    text = text.replace(
        "drain_timeout = \"10s\"",
        "drain_timeout = \"10s\"\nmax_body_bytes = \"4KiB\"",
    );
    let gw = gateway(&text).await;
    let base = format!("http://{}", gw.data_addr());
    let chat = format!("{base}/v1/chat/completions");

    let malformed = read(
        send(request(
            http::Method::POST,
            &chat,
            Some(KEY),
            "{\"model\": \"qwen3\", ",
        ))
        .await,
    )
    .await;
    assert_eq!(
        (malformed.status.as_u16(), error_code(&malformed).as_str()),
        (400, "invalid_request")
    );
    assert_eq!(malformed.json()["error"]["type"], "invalid_request_error");

    let unknown = post(
        &chat,
        Some(KEY),
        &json!({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (unknown.status.as_u16(), error_code(&unknown).as_str()),
        (404, "model_not_found")
    );

    let big = "x".repeat(5000);
    let too_large = post(
        &chat,
        Some(KEY),
        &json!({"model": "qwen3", "messages": [{"role": "user", "content": big}]}),
    )
    .await;
    assert_eq!(
        (too_large.status.as_u16(), error_code(&too_large).as_str()),
        (413, "request_too_large")
    );

    let no_key = post(
        &chat,
        None,
        &json!({"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(
        (no_key.status.as_u16(), error_code(&no_key).as_str()),
        (401, "invalid_api_key")
    );
    let wrong_key = post(
        &chat,
        Some("sk-wrong"),
        &json!({"model": "qwen3", "messages": []}),
    )
    .await;
    assert_eq!(wrong_key.status, 401);

    let route = post(&format!("{base}/v2/nothing"), Some(KEY), &json!({})).await;
    assert_eq!(
        (route.status.as_u16(), error_code(&route).as_str()),
        (404, "not_found")
    );
    let method = get(&chat, Some(KEY)).await;
    assert_eq!(method.status, 405);

    assert_eq!(
        generations(&engine).len(),
        0,
        "no bad request reached the engine"
    );

    let models = get(&format!("{base}/v1/models"), Some(KEY)).await;
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "qwen3");
    gw.shutdown().await;
}

#[tokio::test]
async fn backend_down_is_502_and_unknown_capacity_is_503() {
    // An address nothing listens on: bound, then released.
    let dead = bind().await.local_addr().unwrap();
    let down = format!("{{ url = \"http://{dead}\", kv_tokens = 40960 }}");
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", std::slice::from_ref(&down)),
    ))
    .await;
    let body = json!({"text": "hello", "sampling_params": {"max_new_tokens": 2}});
    let reply = post(
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (502, "upstream_unavailable")
    );
    // No worker address and no hyper error chain reach the client.
    assert!(
        !reply.text().contains(&dead.to_string()) && !reply.text().contains("Connect"),
        "{}",
        reply.text()
    );
    gw.shutdown().await;

    // PD: prefill up, decode down → an error, never the prefill's 200.
    let prefill = engine(SimRole::Prefill, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool("pd", &[worker(&prefill, None)], &[down]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let reply = post(
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    gw.shutdown().await;

    // Capacity neither configured nor discoverable: the worker serves nothing (I3).
    let unknown = format!("{{ url = \"http://{dead}\" }}");
    let gw = gateway(&config_with_pools(WINDOW, &unified_pool("u", &[unknown]))).await;
    let reply = post(
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (503, "no_eligible_worker")
    );
    // Why is for the operator (/ready, the log), not the client.
    assert!(
        !reply.text().contains("KV capacity unknown"),
        "{}",
        reply.text()
    );
    let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
    assert_eq!(ready.status, 503);
    assert!(
        ready.text().contains("KV capacity unknown"),
        "{}",
        ready.text()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn engine_refusal_keeps_its_status_and_message() {
    // The gateway is told a larger prefill pool than the engine has, and the engine does not
    // report its own (no /get_server_info): the fixed engine (--fault none) refuses with its
    // original 400, which the gateway passes on as an error.
    let prefill = engine_with(SimConfig {
        role: SimRole::Prefill,
        model: "qwen3".into(),
        kv_tokens: 256,
        context_length: WINDOW as usize,
        server_info: false,
        ..SimConfig::default()
    })
    .await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool(
        "pd",
        &[worker(&prefill, Some(40960))],
        &[worker(&decode, None)],
    );
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let long = "word ".repeat(400);
    let reply = post(
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        &json!({"text": long}),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(error_code(&reply), "upstream_status");
    assert!(
        !reply.text().contains("exceeds the maximum allowed length"),
        "the engine's message is logged, not sent: {}",
        reply.text()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_stream() {
    let engine = slow_engine(WINDOW as usize, 30).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let body = json!({"text": "a long story ".repeat(50), "stream": true, "sampling_params": {"max_new_tokens": 400}});
    let response = send(request(
        http::Method::POST,
        &format!("http://{}/generate", gw.data_addr()),
        Some(KEY),
        body.to_string(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    use http_body_util::BodyExt;
    let first = body
        .frame()
        .await
        .expect("a first event")
        .expect("readable");
    assert!(first.is_data());
    drop(body);

    let worker = gw.fleet().workers().next().unwrap().clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = engine.engine.stats();
        if stats.streams_cancelled == 1 && worker.outstanding() == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "engine never saw the cancel: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.engine.stats().streams_completed, 0);
    gw.shutdown().await;
}

#[tokio::test]
async fn admin_port_reports_health_readiness_and_metrics() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let admin = format!("http://{}", gw.admin_addr());
    assert_eq!(get(&format!("{admin}/health"), None).await.status, 200);
    let ready = get(&format!("{admin}/ready"), None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    let v = ready.json();
    assert_eq!(v["models"][0]["model"], "qwen3");
    // Discovered from the engine's /get_server_info, not configured.
    assert_eq!(v["models"][0]["workers"][0]["kv_tokens"], 40960);

    let body = json!({"text": "count me", "sampling_params": {"max_new_tokens": 2}});
    assert_eq!(
        post(
            &format!("http://{}/generate", gw.data_addr()),
            Some(KEY),
            &body
        )
        .await
        .status,
        200
    );
    let metrics = get(&format!("{admin}/metrics"), None).await.text();
    assert!(metrics.contains("kvgate_requests_total"), "{metrics}");
    // Exists at zero from start-up: its value says a leg was counted.
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("kvgate_upstream_requests_total")
                && l.contains("outcome=\"ok\"")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)),
        "{metrics}"
    );
    assert!(metrics.contains("kvgate_worker_kv_tokens"), "{metrics}");
    gw.shutdown().await;
}

#[tokio::test]
async fn pools_share_traffic_by_weight() {
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = format!(
        "{}weight = 3\n{}weight = 1\n",
        unified_pool("stable", &[worker(&a, None)]),
        unified_pool("canary", &[worker(&b, None)])
    );
    let config = config_with_pools(WINDOW, &pools)
        .replace("[server]\n", "[server]\nallow_anonymous = true\n");
    let gw = gateway(&config).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}});
    // Anonymous traffic has no tenant to stick to: split request by request, exactly.
    for _ in 0..8 {
        assert_eq!(post(&url, None, &body).await.status, 200);
    }
    assert_eq!((generations(&a).len(), generations(&b).len()), (6, 2));
    // A tenant sticks to one pool while the weights stand still.
    let mut served = std::collections::HashSet::new();
    for _ in 0..8 {
        let reply = post(&url, Some(KEY), &body).await;
        assert_eq!(reply.status, 200);
        served.insert(reply.headers["x-kvgate-pool"].to_str().unwrap().to_owned());
    }
    assert_eq!(served.len(), 1, "{served:?}");
    gw.shutdown().await;
}
