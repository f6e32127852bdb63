//! Shared integration-test harness: simulated engines and gateways on `127.0.0.1:0`
//! (listeners are bound here and handed over, never rebound), and a real HTTP client.
#![allow(dead_code)]

use bytes::Bytes;
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use tokio::net::TcpListener;

use kvgate::config::Config;
use kvgate::runtime::{Gateway, RunningGateway};
use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use kvgate_tokenize::ModelTokenizer;

pub const KEY: &str = "kvgate-demo-key";
pub const KEY_SHA256: &str = "2dfed5a298869fa9315da696048c1321c7fd5a8eb0098a2a7dcfbd7793660871";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Qwen3 tokenizer, loaded once per test binary.
pub fn qwen3() -> Arc<ModelTokenizer> {
    static TOKENIZER: OnceLock<Arc<ModelTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let dir = repo().join("config/tokenizers/qwen3");
            Arc::new(ModelTokenizer::from_dir(&dir).expect("qwen3 tokenizer loads"))
        })
        .clone()
}

pub async fn bind() -> TcpListener {
    TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0")
}

/// A simulated engine of `role` serving model "qwen3".
pub async fn engine(
    role: SimRole,
    fault: SimFault,
    kv_tokens: usize,
    context_length: usize,
) -> RunningSim {
    engine_with(SimConfig {
        role,
        fault,
        kv_tokens,
        context_length,
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await
}

pub async fn engine_with(config: SimConfig) -> RunningSim {
    let bootstrap = if config.role == SimRole::Prefill {
        Some(bind().await)
    } else {
        None
    };
    kvgate_sim::spawn(config, qwen3(), bind().await, bootstrap)
        .await
        .expect("sim engine starts")
}

/// A worker entry for `engine` (capacity left to discovery unless `kv` is given).
pub fn worker(engine: &RunningSim, kv: Option<u64>) -> String {
    let mut s = format!("{{ url = \"http://{}\"", engine.http_addr);
    if let Some(kv) = kv {
        s.push_str(&format!(", kv_tokens = {kv}"));
    }
    if let Some(b) = engine.bootstrap_addr {
        s.push_str(&format!(", bootstrap_port = {}", b.port()));
    }
    s.push_str(" }");
    s
}

/// The standard model, tenant and server tables, with `pools` appended.
pub fn config_with_pools(context_window: u64, pools: &str) -> String {
    format!(
        r#"
[server]
drain_timeout = "10s"

[upstream]
request_timeout = "20s"
discovery_interval = "1h"

[audit]
sink = "none"

{}
{pools}

{}"#,
        model_table("qwen3", context_window),
        tenant_table("t1", KEY)
    )
}

/// The `[[models]]` table of `name` (the Qwen3 tokenizer and chat template), with
/// `context_window`.
pub fn model_table(name: &str, context_window: u64) -> String {
    format!(
        "[[models]]\nname = \"{name}\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\nchat_template = \"tokenizers/qwen3/tokenizer_config.json\"\ncontext_window = {context_window}\n"
    )
}

/// A `[[tenants]]` table: tenant `name`, whose one API key is `key`.
pub fn tenant_table(name: &str, key: &str) -> String {
    format!(
        "[[tenants]]\nname = \"{name}\"\napi_key_sha256 = [\"{}\"]\n",
        kvgate::stack::auth::hash_key(key)
    )
}

pub fn unified_pool(name: &str, workers: &[String]) -> String {
    format!(
        "[[pools]]\nname = \"{name}\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{}]\n",
        workers.join(", ")
    )
}

pub fn pd_pool(name: &str, prefill: &[String], decode: &[String]) -> String {
    format!(
        "[[pools]]\nname = \"{name}\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"disaggregated\"\nprefill = [{}]\ndecode = [{}]\n",
        prefill.join(", "),
        decode.join(", ")
    )
}

pub fn parse_config(text: &str) -> Config {
    Config::from_toml(text, &repo().join("config/test.toml"))
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"))
}

pub async fn gateway(text: &str) -> RunningGateway {
    Gateway::new(parse_config(text))
        .expect("gateway builds")
        .start(bind().await, bind().await)
        .await
        .expect("gateway starts")
}

/// A reply read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The `data:` payloads of an SSE body.
    pub fn sse_data(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| {
            let lines: Vec<&str> = event
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("data:")
                        .map(|d| d.strip_prefix(' ').unwrap_or(d))
                })
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n"))
        })
        .collect()
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub fn request(
    method: Method,
    url: &str,
    key: Option<&str>,
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(url)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {key}"));
    }
    b.body(Full::new(body.into())).expect("request")
}

pub async fn send(req: Request<Full<Bytes>>) -> Response<Incoming> {
    client().request(req).await.expect("HTTP exchange")
}

pub async fn read(response: Response<Incoming>) -> Reply {
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("read body").to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub async fn post(url: &str, key: Option<&str>, body: &Value) -> Reply {
    read(send(request(Method::POST, url, key, body.to_string())).await).await
}

/// POST with extra headers (e.g. `x-kvgate-pool`).
pub async fn post_with(
    url: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &Value,
) -> Reply {
    let mut req = request(Method::POST, url, key, body.to_string());
    for (name, value) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            http::HeaderValue::from_str(value).expect("header value"),
        );
    }
    read(send(req).await).await
}

/// A request to the admin port of `gw` (`token`: the admin token, if any).
pub async fn admin(gw: &RunningGateway, method: Method, path: &str, token: Option<&str>) -> Reply {
    let url = format!("http://{}{path}", gw.admin_addr());
    read(send(request(method, &url, token, Bytes::new())).await).await
}

pub async fn get(url: &str, key: Option<&str>) -> Reply {
    read(send(request(Method::GET, url, key, Bytes::new())).await).await
}

/// The OpenAI error code of a gateway error reply.
pub fn error_code(reply: &Reply) -> String {
    reply.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// What an engine received on its generation routes (discovery probes left out).
pub fn generations(engine: &RunningSim) -> Vec<kvgate_sim::ReceivedRequest> {
    engine
        .engine
        .received()
        .into_iter()
        .filter(|r| {
            matches!(
                r.path.as_str(),
                "/generate" | "/v1/chat/completions" | "/v1/completions" | "/v1/messages"
            )
        })
        .collect()
}

/// The OpenAI error message of a gateway error reply.
pub fn error_message(reply: &Reply) -> String {
    reply.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// A unified "qwen3" engine that spends `latency_ms` per generated token, so a test can
/// hold a stream open.
pub async fn slow_engine(context_length: usize, latency_ms: u64) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: 40960,
        context_length,
        token_latency: std::time::Duration::from_millis(latency_ms),
        ..SimConfig::default()
    })
    .await
}

/// `text` without the gateway's `"request_id":"…"` fields: a random hex id is no part of an
/// answer, and may by chance contain a fragment a test looks for.
pub fn without_request_ids(text: &str) -> String {
    const FIELD: &str = "\"request_id\":\"";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(FIELD) {
        out.push_str(&rest[..at]);
        let after = &rest[at + FIELD.len()..];
        rest = after.find('"').map_or("", |end| &after[end + 1..]);
    }
    out.push_str(rest);
    out
}

/// A Python with the official `openai` SDK for the SDK tests (`.ci/run` installs it):
/// `None` after a notice when there is none here, a failure under CI (`CI` set).
pub fn sdk_python() -> Option<&'static str> {
    python_with("openai")
}

/// `python3` when it can import the official Anthropic SDK (`anthropic`); on CI its absence
/// fails the test, elsewhere it is skipped with a note.
pub fn anthropic_python() -> Option<&'static str> {
    python_with("anthropic")
}

fn python_with(module: &str) -> Option<&'static str> {
    let found = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("python3");
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the SDK tests need `python3 -m pip install {module}` (CI installs it)"
    );
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SDK test SKIPPED: no `{module}` module for python3 (python3 -m pip install {module})\n"
    );
    None
}

/// Runs `tests/sdk/<script>` with `args` under `python` off the async threads, asserts it
/// exited 0 (its output, and `context`, in the failure), and returns its stdout.
async fn run_sdk_script(
    python: &'static str,
    script: &str,
    args: Vec<String>,
    context: impl Fn() -> String,
) -> String {
    let script = repo().join("tests/sdk").join(script);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(script)
            .args(args)
            .output()
    })
    .await
    .expect("joins")
    .expect("python runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        context()
    );
    stdout
}

/// Runs `tests/sdk/anthropic_client.py` (the official Anthropic SDK) against the gateway at
/// `base_url`, asserts every case succeeded and returns each case's observations by name.
pub async fn run_anthropic_sdk(
    python: &'static str,
    base_url: String,
    model: &str,
) -> std::collections::HashMap<String, Value> {
    let args = vec![base_url, KEY.to_owned(), model.to_owned()];
    let stdout = run_sdk_script(python, "anthropic_client.py", args, String::new).await;
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| (v["case"].as_str().unwrap_or_default().to_owned(), v))
        .collect()
}

/// Runs `tests/sdk/openai_client.py` (the official OpenAI SDK) against `base_url` with
/// `extra` arguments, and asserts every step succeeded; `context` is added to a failure.
pub async fn run_openai_sdk(
    python: &'static str,
    base_url: String,
    extra: &[&str],
    context: impl Fn() -> String,
) {
    let mut args = vec![
        "--base-url".to_owned(),
        base_url,
        "--api-key".into(),
        KEY.into(),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let stdout = run_sdk_script(python, "openai_client.py", args, context).await;
    let mut steps = vec![
        "models.retrieve",
        "content_parts",
        "enable_thinking_false",
        "tool_loop",
        "tool_loop_streamed",
    ];
    if extra.contains(&"--embeddings") {
        steps.push("embeddings");
    }
    if extra.contains(&"--responses") {
        steps.push("responses");
    }
    if extra.contains(&"--image-model") {
        steps.push("image_chat");
    }
    for step in steps {
        assert!(
            stdout.contains(&format!("\"step\": \"{step}\", \"ok\": true")),
            "{step}: {stdout}"
        );
    }
}

/// A POST as the Anthropic SDK sends it: `x-api-key` and `anthropic-version`.
pub async fn anthropic_post(gw: &RunningGateway, path: &str, body: &Value) -> Reply {
    let url = format!("http://{}{path}", gw.data_addr());
    post_with(
        &url,
        None,
        &[("x-api-key", KEY), ("anthropic-version", "2023-06-01")],
        body,
    )
    .await
}

/// The `error.type` of an Anthropic error reply (asserting the shape).
pub fn anthropic_error_type(reply: &Reply) -> String {
    let body = reply.json();
    assert_eq!(body["type"], "error", "{body}");
    body["error"]["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The outcome of a quiet-leak probe (Bob's answer read from Alice's stale pages): with the
/// leak detector `off` the fault is real (`secret` shows, a 200); on, it never shows, the
/// answer is a 502 or, streamed, ends in an error event, and the suspicion is audited.
/// Returns whether the detector was on.
pub fn assert_leak_outcome(
    mode: &str,
    stream: bool,
    reply: &Reply,
    text: &str,
    gw: &RunningGateway,
    secret: &str,
) -> bool {
    if mode == "off" {
        assert_eq!(reply.status, 200, "{text}");
        assert!(text.contains(secret), "the fault is real: {text}");
        return false;
    }
    assert!(
        !text.contains(secret),
        "stream={stream}: bob saw alice's secret: {text}"
    );
    if stream {
        assert!(text.contains("event: error"), "{text}");
    } else {
        assert_eq!(reply.status, 502, "{text}");
    }
    assert!(gw
        .audit()
        .recent()
        .iter()
        .any(|l| l["event"] == "leak_suspected"));
    true
}
