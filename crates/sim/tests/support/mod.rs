//! Shared harness of the simulated engine's integration tests: engines on `127.0.0.1:0`
//! (listener kept, no sleeps) and a real HTTP client.
#![allow(dead_code, unused_imports)]

pub use std::net::SocketAddr;
pub use std::path::PathBuf;
pub use std::sync::{Arc, LazyLock};
pub use std::time::Duration;

pub use bytes::Bytes;
pub use http_body_util::{BodyExt, Full};
pub use hyper::{Method, Request, StatusCode};
pub use hyper_util::client::legacy::connect::HttpConnector;
pub use hyper_util::client::legacy::Client;
pub use hyper_util::rt::TokioExecutor;
pub use serde_json::{json, Value};

pub use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
pub use kvgate_tokenize::ModelTokenizer;

pub static QWEN3: LazyLock<Arc<ModelTokenizer>> = LazyLock::new(|| {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../config/tokenizers/qwen3");
    let tok = ModelTokenizer::from_dir(&dir).expect("qwen3 tokenizer ships with the repository");
    Arc::new(tok)
});

pub const MODEL: &str = "qwen3-sim";

pub fn config(role: SimRole) -> SimConfig {
    SimConfig {
        role,
        model: MODEL.into(),
        kv_tokens: 4096,
        context_length: 8192,
        ..SimConfig::default()
    }
}

pub async fn start(config: SimConfig) -> RunningSim {
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let bootstrap = match config.role {
        SimRole::Prefill => Some(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()),
        _ => None,
    };
    kvgate_sim::spawn(config, Arc::clone(&QWEN3), http, bootstrap)
        .await
        .unwrap()
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    body: Bytes,
) -> (StatusCode, Bytes) {
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

pub async fn post(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Value) {
    let (status, bytes) = send(addr, Method::POST, path, Bytes::from(body.to_string())).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub async fn get(addr: SocketAddr, path: &str) -> (StatusCode, Value) {
    let (status, bytes) = send(addr, Method::GET, path, Bytes::new()).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// SSE payloads (`data: ...`), `[DONE]` kept as the string `"[DONE]"`.
pub async fn post_sse(addr: SocketAddr, path: &str, body: &Value) -> (StatusCode, Vec<Value>) {
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

pub fn with_bootstrap(mut body: Value, prefill: &RunningSim, room: Value) -> Value {
    let addr = prefill.bootstrap_addr.unwrap();
    let map = body.as_object_mut().unwrap();
    map.insert("bootstrap_host".into(), json!(addr.ip().to_string()));
    map.insert("bootstrap_port".into(), json!(addr.port()));
    map.insert("bootstrap_room".into(), room);
    body
}

/// Sends the same request to a prefill and a decode at once, as SGLang's router does.
pub async fn pd_post(
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
pub fn echo(ids: &[u32], max_new: usize) -> String {
    let n = max_new.min(ids.len());
    QWEN3.decode(&ids[ids.len() - n..], true).unwrap()
}

pub const PROMPT: &str =
    "Paged attention keeps the KV cache in fixed-size pages so that memory is not wasted.";

/// The token ids of a chat completions body's prompt, prepared as SGLang prepares it (the
/// sim's default `--chat-rules`).
pub fn chat_prompt_ids(body: &serde_json::Value) -> Vec<u32> {
    let request = kvgate_tokenize::ChatRequest::from_body(body.as_object().expect("an object"))
        .expect("messages");
    let prompt = QWEN3
        .chat_prompt(kvgate_tokenize::ChatRules::Sglang, &request)
        .expect("the chat renders");
    QWEN3.chat_prompt_ids(&prompt).expect("ids")
}
