//! Setup shared by the benches that build a gateway (`mod common;` in each): the runtime,
//! the Qwen3 tokenizer and model table, a simulated engine, the config and a request
//! through the stack. Each bench uses part of it.
#![allow(dead_code)]

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use std::path::PathBuf;
use std::sync::Arc;

use kvgate::config::Config;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use kvgate_tokenize::ModelTokenizer;

/// The bench tenant's API key.
pub const KEY: &str = "kvgate-demo-key";

/// A two-worker runtime for the async parts.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Qwen3 tokenizer with its chat template, as the gateway loads it.
pub fn qwen3() -> Arc<ModelTokenizer> {
    let dir = repo().join("config/tokenizers/qwen3");
    kvgate::runtime::load_tokenizer(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )
    .unwrap()
}

/// The `[[models]]` table of `qwen3` with `context_window`.
pub fn qwen3_model(context_window: u64) -> String {
    format!(
        "[[models]]\nname = \"qwen3\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\nchat_template = \"tokenizers/qwen3/tokenizer_config.json\"\ncontext_window = {context_window}\n"
    )
}

/// The `[[tenants]]` table of the bench tenant, whose key is [`KEY`].
pub fn bench_tenant() -> String {
    format!(
        "[[tenants]]\nname = \"bench\"\napi_key_sha256 = [\"{}\"]\n",
        kvgate::stack::auth::hash_key(KEY)
    )
}

/// Parse a bench config (paths relative to `config/`).
pub fn config(text: &str) -> Config {
    Config::from_toml(text, &repo().join("config/bench.toml")).unwrap()
}

/// A unified simulated engine serving `qwen3` (64 Ki KV tokens, 32 Ki context) on loopback.
pub fn engine(rt: &tokio::runtime::Runtime, tokenizer: Arc<ModelTokenizer>) -> RunningSim {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let config = SimConfig {
            role: SimRole::Unified,
            model: "qwen3".into(),
            kv_tokens: 65536,
            context_length: 32768,
            ..SimConfig::default()
        };
        kvgate_sim::spawn(config, tokenizer, listener, None)
            .await
            .unwrap()
    })
}

/// `POST /generate` with `body`, as the bench tenant, for the stack.
pub fn generate(body: &Bytes) -> Request<Full<Bytes>> {
    Request::post("/generate")
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Full::new(body.clone()))
        .unwrap()
}
