//! Quirks of real OpenAI-style engines (llama.cpp's server, llama-cpp-python), reproduced
//! by a raw-TCP fake engine: a keep-alive connection closed after every answer, a request
//! read and never answered, one tenant's requests that make the engine answer 500.

#[path = "support/raw_engine.rs"]
mod raw_engine;
mod support;

use raw_engine::{Quirk, RawEngine};
use serde_json::{json, Value};
use support::*;

const WINDOW: u64 = 32768;

fn openai_pool(name: &str, engine: &RawEngine) -> String {
    format!(
        "[[pools]]\nname = \"{name}\"\nmodel = \"qwen3\"\nengine = \"openai\"\nmode = \"unified\"\nworkers = [{{ url = \"http://{}\", kv_tokens = 40960 }}]\n",
        engine.addr
    )
}

fn chat(stream: bool) -> Value {
    json!({"model": "qwen3", "stream": stream, "max_tokens": 8,
           "messages": [{"role": "user", "content": "hello there"}]})
}

/// `kvgate_upstream_retries_total` for one pool and reason.
fn retries(pool: &str, reason: &str) -> u64 {
    let text = kvgate::metrics::handle().render();
    text.lines()
        .filter(|l| l.starts_with("kvgate_upstream_retries_total{"))
        .filter(|l| {
            l.contains(&format!("pool=\"{pool}\"")) && l.contains(&format!("reason=\"{reason}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[tokio::test]
async fn streams_survive_an_engine_that_closes_keep_alive_connections() {
    // Deterministic: every pooled connection is dead by the time it is reused.
    let engine = RawEngine::start(Quirk::CloseBeforeNextRequest).await;
    let gw = gateway(&config_with_pools(WINDOW, &openai_pool("stale", &engine))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for i in 0..60 {
        let reply = post(&url, Some(KEY), &chat(true)).await;
        assert_eq!(reply.status, 200, "stream {i}: {}", reply.text());
        assert_eq!(
            reply.sse_data().last().map(String::as_str),
            Some("[DONE]"),
            "stream {i}"
        );
    }
    // Every other request found its pooled connection dead and was sent again on a fresh
    // one (which is not pooled, so the request after it opens a new connection).
    let retried = retries("stale", "stale_connection");
    assert!((29..=59).contains(&retried), "{retried}");
    assert_eq!(
        engine.generations().len(),
        60,
        "no request reached the engine twice"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn streams_survive_an_engine_that_closes_right_after_each_answer() {
    // As llama-server does: the close races the next request.
    let engine = RawEngine::start(Quirk::CloseAfterAnswer).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &openai_pool("llama_like", &engine),
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for i in 0..60 {
        let reply = post(&url, Some(KEY), &chat(true)).await;
        assert_eq!(reply.status, 200, "stream {i}: {}", reply.text());
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_read_on_a_fresh_connection_and_never_answered_is_not_retried() {
    // A fresh connection closed after the request was read is the engine failing this
    // request, not a stale idle connection: it is not sent again.
    let engine = RawEngine::start(Quirk::CloseAfterReading).await;
    let gw = gateway(&config_with_pools(WINDOW, &openai_pool("dies", &engine))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for _ in 0..3 {
        let reply = post(&url, Some(KEY), &chat(false)).await;
        assert_eq!(reply.status, 502, "{}", reply.text());
        assert_eq!(error_code(&reply), "upstream_unavailable");
    }
    assert_eq!(engine.generations().len(), 3, "each request was sent once");
    assert_eq!(retries("dies", "stale_connection"), 0);
    gw.shutdown().await;
}

const SECOND_KEY: &str = "kvgate-second-key";

/// Two tenants, one worker that may be ejected (share 1.0), no active checks.
fn two_tenant_config(pool: &str) -> String {
    config_with_pools(WINDOW, pool)
        .replace(
            "[audit]\n",
            "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 3\nmax_ejected_share = 1.0\n\n[audit]\n",
        )
        + "\n"
        + &tenant_table("t2", SECOND_KEY)
}

fn health_state(gw: &kvgate::runtime::RunningGateway) -> &'static str {
    let router = gw.fleet();
    let w = router.workers().next().expect("one worker");
    w.health().snapshot(std::time::Instant::now()).state
}

#[tokio::test]
async fn one_tenants_500s_do_not_eject_a_shared_worker_two_tenants_do() {
    let engine = RawEngine::start(Quirk::Error500).await;
    let gw = gateway(&two_tenant_config(&openai_pool("shared500", &engine))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    // One tenant's requests that make the engine answer 500, many in a row.
    for _ in 0..10 {
        let reply = post(&url, Some(KEY), &chat(false)).await;
        assert!(reply.status.is_server_error(), "{}", reply.text());
        assert_ne!(error_code(&reply), "no_eligible_worker", "{}", reply.text());
    }
    assert_eq!(health_state(&gw), "serving");
    // The other tenant is still served by the worker (it reaches the engine).
    let before = engine.generations().len();
    let reply = post(&url, Some(SECOND_KEY), &chat(false)).await;
    assert_ne!(error_code(&reply), "no_eligible_worker", "{}", reply.text());
    assert_eq!(engine.generations().len(), before + 1);
    // That was a second tenant's 500 in the same run: the worker is out now.
    assert_eq!(health_state(&gw), "ejected");
    let reply = post(&url, Some(KEY), &chat(false)).await;
    assert_eq!(error_code(&reply), "no_eligible_worker", "{}", reply.text());
    gw.shutdown().await;
}

#[tokio::test]
async fn connect_failures_still_eject_whoever_sent_them() {
    let dead = {
        let l = bind().await;
        l.local_addr().unwrap()
    }; // closed: connecting is refused
    let pool = format!(
        "[[pools]]\nname = \"deadpool\"\nmodel = \"qwen3\"\nengine = \"openai\"\nmode = \"unified\"\nworkers = [{{ url = \"http://{dead}\", kv_tokens = 40960 }}]\n"
    );
    let gw = gateway(&two_tenant_config(&pool)).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for _ in 0..3 {
        let reply = post(&url, Some(KEY), &chat(false)).await;
        assert_eq!(
            error_code(&reply),
            "upstream_unavailable",
            "{}",
            reply.text()
        );
    }
    assert_eq!(health_state(&gw), "ejected");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_prompt_count_mismatch_names_both_counts_and_the_likely_cause() {
    // An engine that does not normalize to NFC counts "e\u{301}" as other tokens than the
    // Qwen3 tokenizer (which composes it to "é") does.
    let engine = RawEngine::start(Quirk::ReportPromptTokens(999)).await;
    let gw = gateway(&config_with_pools(WINDOW, &openai_pool("nfc", &engine))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let body = json!({"model": "qwen3", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "caf\u{65}\u{301} au lait"}]});
    let reply = post(&url, Some(KEY), &body).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(error_code(&reply), "upstream_integrity_error");
    let message = error_message(&reply);
    assert!(
        message.contains("the engine counted 999 prompt tokens where kvgate counted"),
        "{message}"
    );
    assert!(message.contains("Unicode NFC"), "{message}");
    gw.shutdown().await;
}
