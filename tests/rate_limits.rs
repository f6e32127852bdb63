//! Tenant rate limits end to end: 429 with Retry-After and x-ratelimit headers, concurrency
//! held until the response body ends, tokens settled with engine usage, and limits shared
//! across two gateways through one real Redis.

mod support;
mod support_redis;

use serde_json::json;
use std::time::Duration;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

fn config(pools: &str, limits: &str, tenant_extra: &str) -> String {
    format!(
        r#"
[audit]
sink = "none"
[upstream]
discovery_interval = "1h"
{limits}
{}{pools}
{}{tenant_extra}
{}"#,
        model_table("qwen3", WINDOW),
        tenant_table("metered", "sk-metered"),
        tenant_table("free", "sk-free")
    )
}

fn small() -> serde_json::Value {
    json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})
}

#[tokio::test]
async fn requests_per_minute_answer_429_with_retry_after_and_ratelimit_headers() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "requests_per_minute = 3",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    for i in 0..3 {
        let r = post(&url, Some("sk-metered"), &small()).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.headers["x-ratelimit-limit-requests"], "3");
        assert_eq!(
            r.headers["x-ratelimit-remaining-requests"],
            (2 - i).to_string().as_str()
        );
    }
    let r = post(&url, Some("sk-metered"), &small()).await;
    assert_eq!(
        (r.status.as_u16(), error_code(&r).as_str()),
        (429, "rate_limit_exceeded")
    );
    assert!(
        r.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(r.headers["x-ratelimit-remaining-requests"], "0");
    assert!(r.headers.contains_key("x-ratelimit-reset-requests"));
    assert_eq!(
        generations(&engine).len(),
        3,
        "the refused request never reached the engine"
    );
    // Another tenant is unaffected.
    assert_eq!(post(&url, Some("sk-free"), &small()).await.status, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_concurrency_slot_lives_until_the_stream_ends() {
    let engine = slow_engine(WINDOW as usize, 20).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "max_concurrent = 1",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    let stream = json!({"text": "long ".repeat(20), "stream": true, "sampling_params": {"max_new_tokens": 20}});
    let first = send(request(
        http::Method::POST,
        &url,
        Some("sk-metered"),
        stream.to_string(),
    ))
    .await;
    assert_eq!(first.status(), 200);
    // Headers have arrived, the stream is still running: the slot is taken.
    let r = post(&url, Some("sk-metered"), &small()).await;
    assert_eq!(
        (r.status.as_u16(), error_code(&r).as_str()),
        (429, "concurrency_limit_exceeded")
    );
    let done = read(first).await;
    assert_eq!(done.sse_data().last().map(String::as_str), Some("[DONE]"));
    // The slot came back with the end of the body.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let r = post(&url, Some("sk-metered"), &small()).await;
        if r.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slot never released"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A client that walks away mid-stream gives the slot back too.
    let walked = send(request(
        http::Method::POST,
        &url,
        Some("sk-metered"),
        stream.to_string(),
    ))
    .await;
    let mut body = walked.into_body();
    use http_body_util::BodyExt;
    body.frame().await.unwrap().unwrap();
    drop(body);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if post(&url, Some("sk-metered"), &small()).await.status == 200 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "slot not released after a disconnect"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn tokens_are_reserved_at_admission_and_settled_with_engine_usage() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "tokens_per_minute = 10000",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    // 10 prompt tokens, up to 1000 new ones reserved; the engine generates far fewer.
    let body = json!({"input_ids": vec![9707u32; 10], "sampling_params": {"max_new_tokens": 1000}});
    let started = std::time::Instant::now();
    let r1 = post(&url, Some("sk-metered"), &body).await;
    assert_eq!(r1.status, 200);
    let remaining = |r: &Reply| {
        r.headers["x-ratelimit-remaining-tokens"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(
        remaining(&r1),
        10_000 - 1010,
        "reserved prompt + max new tokens"
    );
    let used = r1.json()["meta_info"]["prompt_tokens"].as_u64().unwrap()
        + r1.json()["meta_info"]["completion_tokens"]
            .as_u64()
            .unwrap();
    assert!(used < 1010);
    let r2 = post(&url, Some("sk-metered"), &body).await;
    // The first request was settled at its real usage before the second reserved. The
    // bucket refills 10,000 tokens a minute meanwhile: at most what the time both took
    // allows (on a loaded machine that is more than a few tokens).
    let refill = (started.elapsed().as_secs_f64() * 10_000.0 / 60.0).ceil() as u64 + 1;
    let expected = 10_000 - used - 1010;
    assert!(
        remaining(&r2) >= expected && remaining(&r2) <= expected + refill,
        "{} vs {expected} (+ up to {refill} refilled)",
        remaining(&r2)
    );
    // A request that can never fit the minute's budget is a 400, not a 429.
    let huge =
        json!({"input_ids": vec![9707u32; 10], "sampling_params": {"max_new_tokens": 20000}});
    let r = post(&url, Some("sk-metered"), &huge).await;
    assert_eq!(
        (r.status.as_u16(), error_code(&r).as_str()),
        (400, "tokens_exceed_rate_limit")
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn two_gateways_sharing_one_redis_hold_a_tenant_to_its_limit() {
    let redis = support_redis::RedisServer::start();
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let limits = format!("[limits]\nbackend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"kvgate-test\"\nfailure_policy = \"fail_closed\"\n", redis.url());
    let text = config(
        &unified_pool("u", &[worker(&engine, None)]),
        &limits,
        "requests_per_minute = 50",
    );
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    let mut tasks = Vec::new();
    for i in 0..160 {
        let url = format!(
            "http://{}/generate",
            if i % 2 == 0 {
                a.data_addr()
            } else {
                b.data_addr()
            }
        );
        tasks.push(tokio::spawn(async move {
            post(&url, Some("sk-metered"), &small())
                .await
                .status
                .as_u16()
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(ok + limited, 160);
    // Within ±5% of the limit (it should be exact: one atomic script per reservation).
    assert!(
        (48..=52).contains(&ok),
        "admitted {ok} of 160 against a limit of 50 shared by two gateways"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn memory_mode_holds_one_gateway_to_the_same_bound() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "requests_per_minute = 50",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    let tasks: Vec<_> = (0..120)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                post(&url, Some("sk-metered"), &small())
                    .await
                    .status
                    .as_u16()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += u32::from(t.await.unwrap() == 200);
    }
    assert!((48..=52).contains(&ok), "admitted {ok}");
    gw.shutdown().await;
}

/// A gateway (and its engine) whose limits live in `redis`, with `policy` when it fails.
async fn redis_gateway(
    redis: &support_redis::RedisServer,
    policy: &str,
    tenant_limits: &str,
) -> (kvgate_sim::RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let limits = format!(
        "[limits]\nbackend = \"redis\"\nredis_url = \"{}\"\nfailure_policy = \"{policy}\"\n",
        redis.url()
    );
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        &limits,
        tenant_limits,
    ))
    .await;
    (engine, gw)
}

#[tokio::test]
async fn when_redis_dies_fail_open_serves_and_fail_closed_refuses() {
    for (policy, expect) in [("fail_open", 200u16), ("fail_closed", 429u16)] {
        let mut redis = support_redis::RedisServer::start();
        let (_engine, gw) = redis_gateway(&redis, policy, "requests_per_minute = 1000").await;
        let url = format!("http://{}/generate", gw.data_addr());
        assert_eq!(
            post(&url, Some("sk-metered"), &small()).await.status,
            200,
            "{policy}: Redis up"
        );
        redis.kill();
        let r = post(&url, Some("sk-metered"), &small()).await;
        assert_eq!(
            r.status.as_u16(),
            expect,
            "{policy}: Redis down: {}",
            r.text()
        );
        if expect == 429 {
            assert_eq!(error_code(&r), "rate_limit_unavailable");
        }
        let metrics = get(&format!("http://{}/metrics", gw.admin_addr()), None)
            .await
            .text();
        assert!(
            metrics.contains("kvgate_limit_store_errors_total"),
            "{metrics}"
        );
        // Tenants without limits never touch Redis.
        assert_eq!(post(&url, Some("sk-free"), &small()).await.status, 200);
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn a_gateway_whose_redis_is_down_starts_serves_by_policy_and_connects_later() {
    for (policy, while_down) in [("fail_open", 200u16), ("fail_closed", 429u16)] {
        // Redis is down when the gateway starts (killed: its socket is gone).
        let mut redis = support_redis::RedisServer::start();
        redis.kill();
        let (_engine, gw) = redis_gateway(&redis, policy, "requests_per_minute = 2").await;
        let url = format!("http://{}/generate", gw.data_addr());
        let r = post(&url, Some("sk-metered"), &small()).await;
        assert_eq!(r.status.as_u16(), while_down, "{policy}: {}", r.text());
        if while_down == 429 {
            assert_eq!(error_code(&r), "rate_limit_unavailable");
        }
        assert_eq!(post(&url, Some("sk-free"), &small()).await.status, 200);

        // Redis comes up: the gateway connects by itself and enforces the shared limit
        // (2 a minute: at most two more admissions, then 429 from the budget itself).
        redis.restart();
        let mut enforced = false;
        for _ in 0..200 {
            let r = post(&url, Some("sk-metered"), &small()).await;
            if r.status == 429 && error_code(&r) == "rate_limit_exceeded" {
                enforced = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            enforced,
            "{policy}: the limit was never enforced from Redis"
        );
        gw.shutdown().await;
    }
}
