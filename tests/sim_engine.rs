//! Integration tests of the simulated engine over real sockets, with a real HTTP client.
//!
//! Every engine listens on `127.0.0.1:0` and keeps its listener; no test sleeps for
//! readiness and none asserts on wall-clock time.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use kvgate_tokenize::ModelTokenizer;

static QWEN3: LazyLock<Arc<ModelTokenizer>> = LazyLock::new(|| {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen3");
    let tok = ModelTokenizer::from_files(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .expect("qwen3 tokenizer ships with the repository");
    Arc::new(tok)
});

const MODEL: &str = "qwen3-sim";

fn config(role: SimRole) -> SimConfig {
    SimConfig {
        role,
        model: MODEL.into(),
        kv_tokens: 4096,
        context_length: 8192,
        ..SimConfig::default()
    }
}

async fn start(config: SimConfig) -> RunningSim {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bootstrap = match config.role {
        SimRole::Prefill => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
        _ => None,
    };
    kvgate_sim::spawn(config, Arc::clone(&QWEN3), http, bootstrap)
        .await
        .unwrap()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(addr: SocketAddr, method: Method, path: &str, body: Bytes) -> (StatusCode, Bytes) {
    let req = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes())
}

async fn post(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Value) {
    let (status, bytes) = send(addr, Method::POST, path, Bytes::from(body.to_string())).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn get(addr: SocketAddr, path: &str) -> (StatusCode, Value) {
    let (status, bytes) = send(addr, Method::GET, path, Bytes::new()).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// SSE payloads (`data: ...`), `[DONE]` kept as the string `"[DONE]"`.
async fn post_sse(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Vec<Value>) {
    let (status, bytes) = send(addr, Method::POST, path, Bytes::from(body.to_string())).await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let data = e
                .strip_prefix("data: ")
                .expect("every event is a data line");
            serde_json::from_str(data).unwrap_or_else(|_| Value::String(data.to_string()))
        })
        .collect();
    (status, events)
}

fn with_bootstrap(mut body: Value, prefill: &RunningSim, room: Value) -> Value {
    let addr = prefill.bootstrap_addr.unwrap();
    let map = body.as_object_mut().unwrap();
    map.insert("bootstrap_host".into(), json!(addr.ip().to_string()));
    map.insert("bootstrap_port".into(), json!(addr.port()));
    map.insert("bootstrap_room".into(), room);
    body
}

/// Sends the same request to a prefill and a decode at once, as SGLang's router does.
async fn pd_post(
    prefill: &RunningSim,
    decode: &RunningSim,
    path: &str,
    body: &Value,
) -> ((StatusCode, Value), (StatusCode, Value)) {
    tokio::join!(
        post(prefill.http_addr, path, body),
        post(decode.http_addr, path, body)
    )
}

/// What a correct sim generates: the last `max_new` tokens of the prompt.
fn echo(ids: &[u32], max_new: usize) -> String {
    let n = max_new.min(ids.len());
    QWEN3.decode(&ids[ids.len() - n..], true).unwrap()
}

const PROMPT: &str =
    "Paged attention keeps the KV cache in fixed-size pages so that memory is not wasted.";

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
    let prompt = QWEN3.apply_chat_template(&messages, None, true).unwrap();
    let ids = QWEN3.encode(&prompt, false).unwrap();
    let chat = json!({"model": MODEL, "messages": messages, "max_tokens": 6});
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
        json!({"model": MODEL, "messages": messages, "max_tokens": 3, "stream": true}),
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
    let chat_ids = QWEN3
        .encode(
            &QWEN3.apply_chat_template(&messages, None, true).unwrap(),
            false,
        )
        .unwrap();
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

    // OpenAI chat through the same hole.
    let c = with_bootstrap(
        json!({"model": MODEL, "messages": [{"role": "user", "content": secret_prompt()}], "max_tokens": 16}),
        &prefill,
        json!(3),
    );
    let _ = pd_post(&prefill, &decode, "/v1/chat/completions", &c).await;
    let d = with_bootstrap(
        json!({"model": MODEL, "messages": [{"role": "user", "content": over_long_prompt()}], "max_tokens": 32}),
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
