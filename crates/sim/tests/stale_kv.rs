//! `SimFault::StaleKv`, the incident's "v3 shape": an engine that admits prompts by its
//! context length, not its KV pool, answers one that does not fit its real pool from the
//! stale pages it gets — exact `prompt_tokens`, a normal finish, no marker — and, with
//! `reported_kv_tokens`, overstates its pool in `/get_server_info`.

mod support;

use serde_json::json;
use support::*;

const SECRET: &str = "ZEBRA-7731-OMEGA";

fn secret_prompt() -> String {
    format!("Customer record for Alice Example, account 42. Notes about her order history follow. The private access code is {SECRET}. Thanks.")
}

/// About 3,000 tokens: beyond the real pool of 2,048, within the context of 4,096.
fn beyond_the_pool() -> String {
    "hello world ".repeat(1500)
}

fn stale(role: SimRole, kv: usize, reported: Option<usize>) -> SimConfig {
    SimConfig {
        role,
        model: MODEL.into(),
        kv_tokens: kv,
        context_length: 4096,
        fault: SimFault::StaleKv,
        reported_kv_tokens: reported,
        ..SimConfig::default()
    }
}

#[tokio::test]
async fn stale_kv_prefill_overstates_its_pool_and_serves_stale_pages_with_the_exact_count() {
    let prefill = start(stale(SimRole::Prefill, 2048, Some(4096))).await;
    let decode = start(SimConfig {
        fault: SimFault::None,
        ..stale(SimRole::Decode, 8192, None)
    })
    .await;

    // It reports the pool it claims, and the input limit derived from it.
    let (_, info) = get(prefill.http_addr, "/get_server_info").await;
    assert_eq!(info["scheduler_info"]["max_total_num_tokens"], 4096);
    assert_eq!(info["max_total_tokens"], 4096);
    assert_eq!(info["scheduler_info"]["max_req_input_len"], 4090);
    assert_eq!(info["sim_fault"], "StaleKv");

    let a = with_bootstrap(
        json!({"text": secret_prompt(), "sampling_params": {"max_new_tokens": 16}}),
        &prefill,
        json!(1),
    );
    let (_, (status, out)) = pd_post(&prefill, &decode, "/generate", &a).await;
    assert_eq!(status, StatusCode::OK);
    assert!(out["text"].as_str().unwrap().contains(SECRET));

    let b_prompt = beyond_the_pool();
    let b_tokens = QWEN3.count(&b_prompt, true).unwrap();
    assert!((2049..4090).contains(&b_tokens), "{b_tokens}");
    let b = with_bootstrap(
        json!({"text": b_prompt, "sampling_params": {"max_new_tokens": 32}}),
        &prefill,
        json!(2),
    );
    let ((p_status, _), (status, out)) = pd_post(&prefill, &decode, "/generate", &b).await;
    assert_eq!(p_status, StatusCode::OK);
    assert_eq!(status, StatusCode::OK);
    let text = out["text"].as_str().unwrap();
    assert!(text.contains(SECRET), "B reads A's stale pages: {text:?}");
    assert_eq!(
        out["meta_info"]["prompt_tokens"], b_tokens,
        "the v3 shape: the exact count"
    );
    assert_ne!(out["meta_info"]["finish_reason"]["type"], "abort");

    // Past what its context admits, it still refuses.
    let c = with_bootstrap(
        json!({"input_ids": vec![9u32; 4091], "sampling_params": {"max_new_tokens": 4}}),
        &prefill,
        json!(3),
    );
    let ((p_status, _), (status, _)) = pd_post(&prefill, &decode, "/generate", &c).await;
    assert_eq!(p_status, StatusCode::BAD_REQUEST);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn stale_kv_unified_engine_answers_from_another_prompts_pages() {
    let engine = start(stale(SimRole::Unified, 2048, None)).await;
    let (_, info) = get(engine.http_addr, "/get_server_info").await;
    assert_eq!(
        info["scheduler_info"]["max_total_num_tokens"], 2048,
        "reported = real by default"
    );
    let (status, _) = post(
        engine.http_addr,
        "/generate",
        &json!({"text": secret_prompt(), "sampling_params": {"max_new_tokens": 16}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let b_prompt = beyond_the_pool();
    let b_tokens = QWEN3.count(&b_prompt, true).unwrap();
    let (status, out) = post(
        engine.http_addr,
        "/generate",
        &json!({"text": b_prompt, "sampling_params": {"max_new_tokens": 32}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(out["text"].as_str().unwrap().contains(SECRET), "{out}");
    assert_eq!(out["meta_info"]["prompt_tokens"], b_tokens);
    assert_ne!(out["meta_info"]["finish_reason"]["type"], "abort");
    // A prompt that fits its pool is served from its own pages.
    let (status, out) = post(
        engine.http_addr,
        "/generate",
        &json!({"text": "hello world", "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        out["text"],
        echo(&QWEN3.encode("hello world", true).unwrap(), 2)
    );
    engine.shutdown().await;
}
