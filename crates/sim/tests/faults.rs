//! The simulated engine's faults over real sockets, first of all the incident's: a stale
//! KV page returned with HTTP 200.

mod support;

use serde_json::json;
use support::*;

/// The incident's two engines: PD, context window 1,048,576 tokens, KV pools of 2,048.
async fn incident_pair(fault: SimFault) -> (RunningSim, RunningSim) {
    let cfg = |role| SimConfig {
        role,
        model: MODEL.into(),
        kv_tokens: 2048,
        context_length: 1_048_576,
        fault,
        ..SimConfig::default()
    };
    (
        start(cfg(SimRole::Prefill)).await,
        start(cfg(SimRole::Decode)).await,
    )
}

const SECRET: &str = "ZEBRA-7731-OMEGA";

fn secret_prompt() -> String {
    format!("Customer record for Alice Example, account 42. Notes about her order history follow. The private access code is {SECRET}. Thanks.")
}

fn over_long_prompt() -> String {
    "hello world ".repeat(2100)
}

#[tokio::test]
async fn incident_fault_leaks_another_users_prompt_with_http_200() {
    let (prefill, decode) = incident_pair(SimFault::Incident).await;
    let a = with_bootstrap(
        json!({"text": secret_prompt(), "sampling_params": {"max_new_tokens": 16}}),
        &prefill,
        json!(1),
    );
    let (_, (status, out)) = pd_post(&prefill, &decode, "/generate", &a).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        out["text"].as_str().unwrap().contains(SECRET),
        "A sees its own prompt's end"
    );

    let b_prompt = over_long_prompt();
    let b_tokens = QWEN3.count(&b_prompt, true).unwrap();
    assert!(b_tokens > 2042, "B is over max_req_input_len");
    let b = with_bootstrap(
        json!({"text": b_prompt, "sampling_params": {"max_new_tokens": 32}}),
        &prefill,
        json!(2),
    );
    let ((p_status, _), (status, out)) = pd_post(&prefill, &decode, "/generate", &b).await;
    assert_eq!(p_status, StatusCode::OK);
    assert_eq!(
        status,
        StatusCode::OK,
        "the bug: an aborted prompt comes back as a success"
    );
    let text = out["text"].as_str().unwrap();
    assert!(text.contains(SECRET), "B received A's secret: {text:?}");
    assert_eq!(
        out["meta_info"]["prompt_tokens"], 1,
        "the placeholder is what the engine reports"
    );
    assert_ne!(out["meta_info"]["finish_reason"]["type"], "abort");
    assert_eq!(prefill.engine.stats().kv_transfers, 2);

    // OpenAI chat through the same hole (thinking off: all of the answer is read from KV).
    let no_thinking = json!({"enable_thinking": false});
    let c = with_bootstrap(
        json!({"model": MODEL, "messages": [{"role": "user", "content": secret_prompt()}], "max_tokens": 16,
               "chat_template_kwargs": no_thinking}),
        &prefill,
        json!(3),
    );
    let _ = pd_post(&prefill, &decode, "/v1/chat/completions", &c).await;
    let d = with_bootstrap(
        json!({"model": MODEL, "messages": [{"role": "user", "content": over_long_prompt()}], "max_tokens": 32,
               "chat_template_kwargs": no_thinking}),
        &prefill,
        json!(4),
    );
    let (_, (status, out)) = pd_post(&prefill, &decode, "/v1/chat/completions", &d).await;
    assert_eq!(status, StatusCode::OK);
    assert!(out["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains(SECRET));
    assert_eq!(out["usage"]["prompt_tokens"], 1);
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn fixed_engine_refuses_before_any_kv_transfer() {
    let (prefill, decode) = incident_pair(SimFault::None).await;
    let a = with_bootstrap(
        json!({"text": secret_prompt(), "sampling_params": {"max_new_tokens": 16}}),
        &prefill,
        json!(1),
    );
    let _ = pd_post(&prefill, &decode, "/generate", &a).await;
    assert_eq!(prefill.engine.stats().kv_transfers, 1);

    let b_prompt = over_long_prompt();
    let b_tokens = QWEN3.count(&b_prompt, true).unwrap();
    let b = with_bootstrap(
        json!({"text": b_prompt, "sampling_params": {"max_new_tokens": 32}}),
        &prefill,
        json!(2),
    );
    let ((p_status, p_out), (status, out)) = pd_post(&prefill, &decode, "/generate", &b).await;
    let expected = format!("Input length ({b_tokens} tokens) exceeds the maximum allowed length (2042 tokens). Use a shorter input or enable --allow-auto-truncate.");
    assert_eq!(p_status, StatusCode::BAD_REQUEST);
    assert_eq!(p_out["error"]["message"], expected);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"]["message"], expected);
    assert!(!out.to_string().contains(SECRET));
    let stats = prefill.engine.stats();
    assert_eq!(stats.kv_transfers, 1, "no KV left the prefill for B");
    assert_eq!(stats.rooms_aborted, 1);
    assert_eq!(decode.engine.stats().kv_received, 1);

    // The unified engine refuses likewise.
    let unified = start(SimConfig {
        role: SimRole::Unified,
        kv_tokens: 2048,
        context_length: 1_048_576,
        ..SimConfig::default()
    })
    .await;
    let (status, out) = post(
        unified.http_addr,
        "/generate",
        &json!({"text": over_long_prompt()}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(out["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Input length"));
    unified.shutdown().await;
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn decode_without_its_room_fails_with_the_kvcache_error() {
    let prefill = start(config(SimRole::Prefill)).await;
    let mut cfg = config(SimRole::Decode);
    cfg.bootstrap_timeout = Duration::from_millis(200);
    let decode = start(cfg).await;
    let body = with_bootstrap(json!({"text": PROMPT}), &prefill, json!(99));
    let (status, out) = post(decode.http_addr, "/generate", &body).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        out["error"]["message"],
        "Failed to get kvcache from prefill instance"
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, events) = post_sse(decode.http_addr, "/generate", &streamed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        events[0]["meta_info"]["finish_reason"],
        json!({"type": "abort", "message": "Failed to get kvcache from prefill instance", "status_code": 500, "err_type": null})
    );
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_cancels_the_stream_and_frees_pages() {
    let mut cfg = config(SimRole::Unified);
    cfg.token_latency = Duration::from_millis(20);
    let sim = start(cfg).await;
    let body = json!({"input_ids": (0..200).collect::<Vec<u32>>(), "sampling_params": {"max_new_tokens": 200}, "stream": true});
    let req = Request::post(format!("http://{}/generate", sim.http_addr))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let client = client();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().unwrap().starts_with(b"data: "));
    assert!(
        sim.engine.used_kv_tokens() > 0,
        "the stream holds its pages"
    );
    drop(body);
    drop(client);
    let stats = sim
        .engine
        .wait_for_stats(Duration::from_secs(10), |s| s.streams_cancelled == 1)
        .await
        .unwrap();
    assert_eq!(stats.streams_started, 1);
    assert_eq!(stats.streams_completed, 0);
    assert_eq!(sim.engine.used_kv_tokens(), 0);
    sim.shutdown().await;
}

async fn unified_with(fault: SimFault) -> RunningSim {
    let mut cfg = config(SimRole::Unified);
    cfg.fault = fault;
    start(cfg).await
}

#[tokio::test]
async fn fault_abort_mid_stream() {
    let sim = unified_with(SimFault::AbortMidStream).await;
    let (status, events) = post_sse(
        sim.http_addr,
        "/generate",
        &json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 10}, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    assert_eq!(n, 5, "three tokens, the abort, [DONE]");
    assert_eq!(events[n - 2]["meta_info"]["finish_reason"]["type"], "abort");
    let (status, out) = post(sim.http_addr, "/generate", &json!({"text": PROMPT})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["meta_info"]["finish_reason"]["type"], "abort");
    let (_, events) = post_sse(
        sim.http_addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": PROMPT}], "stream": true}),
    )
    .await;
    assert_eq!(
        events[events.len() - 2]["choices"][0]["finish_reason"],
        "abort"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_error_event() {
    let sim = unified_with(SimFault::ErrorEvent).await;
    let (status, events) = post_sse(
        sim.http_addr,
        "/generate",
        &json!({"text": PROMPT, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    assert!(events[n - 2]["error"]["message"].is_string());
    let (status, events) = post_sse(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events[events.len() - 2]["error"]["code"], 500);
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_abort_no_status() {
    let sim = unified_with(SimFault::AbortNoStatus).await;
    let (status, out) = post(sim.http_addr, "/generate", &json!({"text": PROMPT})).await;
    assert_eq!(status, StatusCode::OK);
    let finish = &out["meta_info"]["finish_reason"];
    assert_eq!(finish["type"], "abort");
    assert!(finish.get("status_code").unwrap().is_null());
    let (status, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": PROMPT}]}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["choices"][0]["finish_reason"], "abort");
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_hang_and_reset() {
    let hang = unified_with(SimFault::Hang).await;
    let answered = tokio::time::timeout(
        Duration::from_millis(300),
        post(hang.http_addr, "/generate", &json!({"text": "x"})),
    )
    .await;
    assert!(answered.is_err(), "a hanging engine never answers");
    assert_eq!(
        get(hang.http_addr, "/health").await.0,
        StatusCode::OK,
        "only generation hangs"
    );
    assert_eq!(
        hang.engine
            .received()
            .iter()
            .filter(|r| r.path == "/generate")
            .count(),
        1
    );
    hang.shutdown().await;

    let reset = unified_with(SimFault::Reset).await;
    let req = Request::post(format!("http://{}/generate", reset.http_addr))
        .body(Full::new(Bytes::from_static(b"{\"text\":\"x\"}")))
        .unwrap();
    let result = client().request(req).await;
    assert!(
        result.is_err(),
        "connection closed without a status: {result:?}"
    );
    reset.shutdown().await;
}

#[tokio::test]
async fn fault_wrong_prompt_tokens() {
    let sim = unified_with(SimFault::WrongPromptTokens).await;
    let real = QWEN3.count(PROMPT, true).unwrap();
    let (status, out) = post(sim.http_addr, "/generate", &json!({"text": PROMPT})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["meta_info"]["prompt_tokens"], real - 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn fault_prefill_abort() {
    let mut cfg = config(SimRole::Prefill);
    cfg.fault = SimFault::PrefillAbort;
    let prefill = start(cfg).await;
    let decode = start(config(SimRole::Decode)).await;
    let body = with_bootstrap(json!({"text": PROMPT}), &prefill, json!(5));
    let ((p_status, p_out), (d_status, d_out)) =
        pd_post(&prefill, &decode, "/generate", &body).await;
    assert_eq!(p_status, StatusCode::OK);
    assert_eq!(p_out["meta_info"]["finish_reason"]["type"], "abort");
    assert_eq!(
        d_status,
        StatusCode::OK,
        "an abort without status comes back as 200"
    );
    assert_eq!(d_out["meta_info"]["finish_reason"]["type"], "abort");
    assert!(d_out["meta_info"]["finish_reason"]["status_code"].is_null());
    assert_eq!(prefill.engine.stats().kv_transfers, 0);
    prefill.shutdown().await;
    decode.shutdown().await;
}
