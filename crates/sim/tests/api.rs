//! The simulated engine's HTTP API over real sockets: info endpoints, SGLang and OpenAI
//! shapes, length checks in SGLang's order, PD transfer through the bootstrap server.

mod support;

use serde_json::{json, Value};
use support::*;

#[tokio::test]
async fn info_endpoints_report_the_pool_and_the_role() {
    let unified = start(config(SimRole::Unified)).await;
    let prefill = start(config(SimRole::Prefill)).await;
    for path in ["/get_server_info", "/server_info"] {
        let (status, info) = get(unified.http_addr, path).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(info["context_length"], 8192);
        assert_eq!(info["disaggregation_mode"], "null");
        assert_eq!(info["max_total_tokens"], 4096);
        assert_eq!(info["served_model_name"], MODEL);
        assert_eq!(info["model_path"], MODEL);
        assert_eq!(info["scheduler_info"]["max_total_num_tokens"], 4096);
        assert_eq!(info["scheduler_info"]["max_req_input_len"], 4090);
        assert_eq!(info["scheduler_info"]["status"], "ok");
        assert_eq!(info["version"], "0.5.22-sim");
    }
    let (_, info) = get(prefill.http_addr, "/get_server_info").await;
    assert_eq!(info["disaggregation_mode"], "prefill");
    assert_eq!(
        info["disaggregation_bootstrap_port"],
        prefill.bootstrap_addr.unwrap().port()
    );

    let (status, models) = get(unified.http_addr, "/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["root"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["max_model_len"], 8192);
    let (status, model_info) = get(unified.http_addr, "/get_model_info").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(model_info["is_generation"], true);
    let (status, loads) = get(unified.http_addr, "/v1/loads").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(loads["max_total_num_tokens"], 4096);
    assert_eq!(loads["num_used_tokens"], 0);
    for sim in [&unified, &prefill] {
        assert_eq!(
            send(sim.http_addr, Method::GET, "/health", Bytes::new())
                .await
                .0,
            StatusCode::OK
        );
        assert_eq!(
            send(sim.http_addr, Method::GET, "/health_generate", Bytes::new())
                .await
                .0,
            StatusCode::OK
        );
    }

    let (status, body) = get(unified.http_addr, "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["detail"], "Not Found");
    let (status, bytes) = send(
        unified.http_addr,
        Method::POST,
        "/generate",
        Bytes::from_static(b"{\"text\": "),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Invalid JSON"));
    let (status, bytes) = send(
        unified.http_addr,
        Method::POST,
        "/v1/chat/completions",
        Bytes::from_static(b"not json"),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(body["object"], "error");
    assert_eq!(body["code"], 400);
    let (status, body) = post(
        unified.http_addr,
        "/generate",
        &json!({"sampling_params": {}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Either text"));
    let (status, body) = post(
        unified.http_addr,
        "/v1/chat/completions",
        &json!({"model": "other", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["code"], "model_not_found");

    // Every request is logged, with its parsed body and size, before anything else.
    let received = unified.engine.received();
    let bad = received
        .iter()
        .find(|r| r.path == "/generate" && r.body.is_null())
        .unwrap();
    assert_eq!(bad.bytes, 9);
    assert_eq!(unified.engine.stats().requests as usize, received.len());
    unified.shutdown().await;
    prefill.shutdown().await;
}

#[tokio::test]
async fn unified_generate_plain_streamed_and_batched() {
    let sim = start(config(SimRole::Unified)).await;
    let ids = QWEN3.encode(PROMPT, true).unwrap();
    let (status, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 5}, "rid": "r1"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["text"], echo(&ids, 5));
    assert_eq!(out["meta_info"]["id"], "r1");
    assert_eq!(out["meta_info"]["prompt_tokens"], ids.len());
    assert_eq!(out["meta_info"]["completion_tokens"], 5);
    assert_eq!(out["meta_info"]["cached_tokens"], 0);
    assert_eq!(
        out["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 5})
    );
    assert!(out["meta_info"]["e2e_latency"].is_number());

    // More new tokens than content: stops early, matching EOS.
    let (_, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 10}}),
    )
    .await;
    assert_eq!(out["meta_info"]["completion_tokens"], 3);
    assert_eq!(
        out["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": 151_645})
    );

    let (status, events) = post_sse(
        sim.http_addr,
        "/generate",
        &json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 4}, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let data = &events[..events.len() - 1];
    assert_eq!(data.len(), 4);
    assert!(data[..3]
        .iter()
        .all(|e| e["meta_info"]["finish_reason"].is_null()));
    assert_eq!(data[3]["text"], echo(&ids, 4));
    assert_eq!(data[3]["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(data[3]["meta_info"]["completion_tokens"], 4);
    assert_eq!(data[3]["index"], 0);
    for pair in data.windows(2) {
        assert!(
            pair[1]["text"]
                .as_str()
                .unwrap()
                .starts_with(pair[0]["text"].as_str().unwrap()),
            "cumulative text"
        );
    }

    let (status, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"text": [PROMPT, "second prompt"], "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let list = out.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(
        list[1]["text"],
        echo(&QWEN3.encode("second prompt", true).unwrap(), 2)
    );
    let (_, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(out[1]["meta_info"]["prompt_tokens"], 2);
    assert_eq!(
        sim.engine.used_kv_tokens(),
        0,
        "pages are freed after the response"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn unified_openai_chat_and_completions() {
    let sim = start(config(SimRole::Unified)).await;
    let messages =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]);
    // Thinking off: the answer is the end of the prompt, not a thought (Qwen3 thinks by default).
    let chat = json!({"model": MODEL, "messages": messages, "max_tokens": 6,
                      "chat_template_kwargs": {"enable_thinking": false}});
    let ids = chat_prompt_ids(&chat);
    let (status, out) = post(sim.http_addr, "/v1/chat/completions", &chat).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["object"], "chat.completion");
    assert_eq!(out["model"], MODEL);
    assert_eq!(out["choices"][0]["message"]["role"], "assistant");
    assert_eq!(out["choices"][0]["message"]["content"], echo(&ids, 6));
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": 6, "total_tokens": ids.len() + 6, "prompt_tokens_details": null})
    );

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, events) = post_sse(sim.http_addr, "/v1/chat/completions", &streamed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    assert_eq!(events[n - 2]["choices"], json!([]));
    assert_eq!(events[n - 2]["usage"]["prompt_tokens"], ids.len());
    assert_eq!(events[n - 3]["choices"][0]["finish_reason"], "length");
    let content: String = events[1..n - 3]
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(content, echo(&ids, 6));

    // Completions: a string, a list of strings, a token array and a list of token arrays.
    let (status, out) = post(
        sim.http_addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": PROMPT, "max_tokens": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["object"], "text_completion");
    assert_eq!(
        out["choices"][0]["text"],
        echo(&QWEN3.encode(PROMPT, true).unwrap(), 3)
    );
    let (_, out) = post(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": ["a b c", "d e"]}),
    )
    .await;
    assert_eq!(out["choices"].as_array().unwrap().len(), 2);
    assert_eq!(out["choices"][1]["index"], 1);
    let (_, out) = post(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": [10, 11, 12], "max_tokens": 2}),
    )
    .await;
    assert_eq!(out["usage"]["prompt_tokens"], 3);
    assert_eq!(
        out["choices"][0]["text"],
        QWEN3.decode(&[11, 12], true).unwrap()
    );
    let (_, out) = post(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": [[10, 11], [12, 13, 14]], "max_tokens": 1}),
    )
    .await;
    assert_eq!(out["usage"]["prompt_tokens"], 5);
    let (status, events) = post_sse(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": PROMPT, "max_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events[0]["object"], "text_completion");
    let n = events.len();
    assert_eq!(events[n - 2]["choices"][0]["finish_reason"], "length");
    assert!(
        events.iter().all(|e| e.get("usage").is_none()),
        "no usage chunk unless asked"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn length_checks_follow_sglang_order_and_messages() {
    let mut cfg = config(SimRole::Unified);
    cfg.context_length = 64;
    cfg.kv_tokens = 48; // max_req_input_len = min(63, 47) - 5 = 42
    let sim = start(cfg).await;
    let ids = |n: usize| json!((0..n).map(|i| 100 + i as u32).collect::<Vec<_>>());
    let (status, out) = post(sim.http_addr, "/generate", &json!({"input_ids": ids(64)})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        out["error"]["message"],
        "The input (64 tokens) is longer than the model's context length (64 tokens)."
    );
    let (status, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": ids(40), "sampling_params": {"max_new_tokens": 30}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(out["error"]["message"].as_str().unwrap().starts_with(
        "Requested token count exceeds the model's maximum context length of 64 tokens."
    ));
    let (status, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": ids(42), "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(out["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("Input length (42 tokens) exceeds the maximum allowed length (42 tokens)."));
    let (status, out) = post(
        sim.http_addr,
        "/v1/completions",
        &json!({"prompt": ids(42), "max_tokens": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["type"], "BadRequestError");
    // Streaming: the scheduler's abort is an event inside an HTTP 200 stream.
    let (status, events) = post_sse(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": ids(42), "sampling_params": {"max_new_tokens": 1}, "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events[0]["meta_info"]["finish_reason"]["type"], "abort");
    assert_eq!(events[0]["meta_info"]["finish_reason"]["status_code"], 400);
    assert_eq!(events[1], "[DONE]");
    let (status, events) = post_sse(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": ids(64), "stream": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(events[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("longer than the model's context length"));
    // Under the limit works, and max_new_tokens is clipped to fit max_req_len.
    let (status, out) = post(
        sim.http_addr,
        "/generate",
        &json!({"input_ids": ids(41), "sampling_params": {"max_new_tokens": 20}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out["meta_info"]["completion_tokens"], 5);
    sim.shutdown().await;
}

#[tokio::test]
async fn pd_generate_and_chat_transfer_kv_through_the_bootstrap_server() {
    let prefill = start(config(SimRole::Prefill)).await;
    let decode = start(config(SimRole::Decode)).await;
    let ids = QWEN3.encode(PROMPT, true).unwrap();
    let body = with_bootstrap(
        json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 5}}),
        &prefill,
        json!(11),
    );
    let ((p_status, p_out), (d_status, d_out)) =
        pd_post(&prefill, &decode, "/generate", &body).await;
    assert_eq!(p_status, StatusCode::OK);
    assert_eq!(p_out["text"], "");
    assert_eq!(p_out["meta_info"]["completion_tokens"], 0);
    assert_eq!(p_out["meta_info"]["prompt_tokens"], ids.len());
    assert_eq!(d_status, StatusCode::OK);
    assert_eq!(d_out["text"], echo(&ids, 5));
    assert_eq!(d_out["meta_info"]["prompt_tokens"], ids.len());
    assert_eq!(prefill.engine.stats().kv_transfers, 1);
    assert_eq!(decode.engine.stats().kv_received, 1);
    assert_eq!(
        prefill.engine.used_kv_tokens(),
        0,
        "prefill pages freed once transferred"
    );

    // Streaming chat, and a batch with one room per prompt.
    let messages = json!([{"role": "user", "content": PROMPT}]);
    let chat = with_bootstrap(
        json!({"model": MODEL, "messages": messages, "max_tokens": 3, "stream": true,
               "chat_template_kwargs": {"enable_thinking": false}}),
        &prefill,
        json!(12),
    );
    let (prefill_events, decode_events) = tokio::join!(
        post_sse(prefill.http_addr, "/v1/chat/completions", &chat),
        post_sse(decode.http_addr, "/v1/chat/completions", &chat)
    );
    assert_eq!(prefill_events.0, StatusCode::OK);
    assert_eq!(prefill_events.1.last().unwrap(), "[DONE]");
    let events = decode_events.1;
    let chat_ids = chat_prompt_ids(&chat);
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, echo(&chat_ids, 3));
    let batch = with_bootstrap(
        json!({"text": [PROMPT, "another one"], "sampling_params": {"max_new_tokens": 2}}),
        &prefill,
        json!([21, 22]),
    );
    let (_, (d_status, d_out)) = pd_post(&prefill, &decode, "/generate", &batch).await;
    assert_eq!(d_status, StatusCode::OK);
    assert_eq!(
        d_out[1]["text"],
        echo(&QWEN3.encode("another one", true).unwrap(), 2)
    );
    let completions = with_bootstrap(
        json!({"prompt": PROMPT, "max_tokens": 2}),
        &prefill,
        json!(23),
    );
    let (_, (d_status, d_out)) = pd_post(&prefill, &decode, "/v1/completions", &completions).await;
    assert_eq!(d_status, StatusCode::OK);
    assert_eq!(d_out["choices"][0]["text"], echo(&ids, 2));
    let (status, _) = post(decode.http_addr, "/generate", &json!({"text": "x"})).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "PD roles need bootstrap fields"
    );
    prefill.shutdown().await;
    decode.shutdown().await;
}
