//! Tenant isolation end to end (I5): per-tenant cache salts, and the leak detector catching
//! the incident by fingerprints alone.

mod support;

use serde_json::{json, Value};
use support::*;

use kvgate_sim::{SimConfig, SimFault, SimRole};

const WINDOW: u64 = 1_048_576;
const SECRET: &str = "ZEBRA-4471-QUOKKA";

fn two_tenants(pools: &str) -> String {
    format!(
        r#"
[audit]
sink = "none"
[upstream]
discovery_interval = "1h"
[isolation]
ngram = 8
min_matches = 2
[[models]]
name = "qwen3"
tokenizer = "tokenizers/qwen3/tokenizer.json"
chat_template = "tokenizers/qwen3/tokenizer_config.json"
context_window = {WINDOW}
{pools}
[[tenants]]
name = "alice"
api_key_sha256 = ["{}"]
[[tenants]]
name = "bob"
api_key_sha256 = ["{}"]
"#,
        kvgate::stack::auth::hash_key("sk-alice"),
        kvgate::stack::auth::hash_key("sk-bob")
    )
}

#[tokio::test]
async fn each_tenant_reaches_the_engine_with_its_own_salt_and_forged_salts_never_pass() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    let gw = gateway(&two_tenants(&unified_pool("u", &[worker(&engine, None)]))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let body = json!({"model": "qwen3", "max_tokens": 2, "messages": [{"role": "user", "content": "the same prompt"}],
                      "cache_salt": "forged", "extra_key": "x", "prompt_cache_key": "y"});
    for key in ["sk-alice", "sk-alice", "sk-bob"] {
        assert_eq!(post(&url, Some(key), &body).await.status, 200);
    }
    let sent: Vec<Value> = generations(&engine).into_iter().map(|r| r.body).collect();
    let salt = |i: usize| sent[i]["cache_salt"].as_str().unwrap().to_owned();
    assert_eq!(salt(0), salt(1), "one tenant, one salt");
    assert_ne!(salt(0), salt(2), "two tenants, two salts");
    for s in &sent {
        assert_eq!(
            s["cache_salt"].as_str().unwrap().len(),
            64,
            "fixed-length hex HMAC"
        );
        assert_ne!(s["cache_salt"], "forged");
        assert!(
            s.get("extra_key").is_none() && s.get("prompt_cache_key").is_none(),
            "{s}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_pool_without_cache_salt_gets_none_and_still_drops_client_keys() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    let pools = format!(
        "{}cache_salt = false\n",
        unified_pool("u", &[worker(&engine, None)])
    );
    let gw = gateway(&two_tenants(&pools)).await;
    let body =
        json!({"text": "hi", "cache_salt": "forged", "sampling_params": {"max_new_tokens": 1}});
    assert_eq!(
        post(
            &format!("http://{}/generate", gw.data_addr()),
            Some("sk-bob"),
            &body
        )
        .await
        .status,
        200
    );
    assert!(generations(&engine)[0].body.get("cache_salt").is_none());
    gw.shutdown().await;
}

/// The incident, with every other guard check switched off: fingerprints alone.
async fn incident_with_guard_off(
    mode: &str,
    stream: bool,
) -> (Reply, kvgate::runtime::app::RunningGateway) {
    let sim = |role| SimConfig {
        role,
        fault: SimFault::Incident,
        kv_tokens: if role == SimRole::Prefill {
            2048
        } else {
            1_048_576
        },
        context_length: WINDOW as usize,
        model: "qwen3".into(),
        server_info: role != SimRole::Prefill,
        ..SimConfig::default()
    };
    let prefill = engine_with(sim(SimRole::Prefill)).await;
    let decode = engine_with(sim(SimRole::Decode)).await;
    let pools = format!(
        "{}leak_detection = \"{mode}\"\n[pools.guard]\nenabled = false\n",
        pd_pool(
            "pd",
            &[worker(&prefill, Some(1_048_576))],
            &[worker(&decode, None)]
        )
    );
    let gw = gateway(&two_tenants(&pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let a = json!({"text": format!("{} The secret code is {SECRET}.", "lorem ".repeat(1200)), "sampling_params": {"max_new_tokens": 24}});
    assert_eq!(post(&url, Some("sk-alice"), &a).await.status, 200);
    let b = json!({"text": "ipsum ".repeat(3000), "stream": stream, "sampling_params": {"max_new_tokens": 24}});
    (post(&url, Some("sk-bob"), &b).await, gw)
}

/// Bob got none of Alice's secret: a 502, or a stream ended by an integrity error event
/// without `[DONE]`.
fn assert_leak_stopped(b: &Reply, stream: bool) {
    let text = b.text();
    assert!(
        !text.contains("QUOKKA") && !text.contains("4471"),
        "stream={stream}: bob saw alice's secret: {text}"
    );
    if stream && b.status.is_success() {
        let data = b.sse_data();
        assert!(!data.iter().any(|d| d == "[DONE]"), "{data:?}");
        assert!(
            data.last().unwrap().contains("upstream_integrity_error"),
            "{data:?}"
        );
    } else {
        assert_eq!(b.status, 502, "{text}");
        assert_eq!(error_code(b), "upstream_integrity_error");
    }
}

#[tokio::test]
async fn the_incident_is_caught_by_fingerprints_alone_in_block_mode() {
    for stream in [false, true] {
        let (b, gw) = incident_with_guard_off("block", stream).await;
        assert_leak_stopped(&b, stream);
        let lines = gw.audit().recent();
        let leak = lines
            .iter()
            .find(|l| l["event"] == "leak_suspected")
            .expect("a leak audit line");
        assert_eq!(leak["tenant"], "bob");
        assert!(
            !leak.to_string().contains("alice"),
            "the alarm names no other tenant: {leak}"
        );
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn detect_mode_reports_and_counts_without_blocking() {
    let (b, gw) = incident_with_guard_off("detect", false).await;
    assert_eq!(
        b.status, 200,
        "detect delivers (the guard's other checks are off here)"
    );
    assert!(gw
        .audit()
        .recent()
        .iter()
        .any(|l| l["event"] == "leak_suspected"));
    let metrics = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    assert!(
        metrics.contains("kvgate_leak_suspected_total{pool=\"pd\"}"),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn two_tenants_sending_the_same_public_document_do_not_trip_it() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    let pools = format!(
        "{}leak_detection = \"block\"\n",
        unified_pool("u", &[worker(&engine, None)])
    );
    let gw = gateway(&two_tenants(&pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let document = "We the People of the United States, in Order to form a more perfect Union, establish Justice, insure domestic Tranquility, provide for the common defence, promote the general Welfare. ".repeat(3);
    for key in ["sk-alice", "sk-bob", "sk-alice", "sk-bob"] {
        // The simulated engine echoes the prompt's tail: each answer quotes the document.
        let body = json!({"text": document, "sampling_params": {"max_new_tokens": 32}});
        let reply = post(&url, Some(key), &body).await;
        assert_eq!(reply.status, 200, "{key}: {}", reply.text());
    }
    assert!(!gw
        .audit()
        .recent()
        .iter()
        .any(|l| l["event"] == "leak_suspected"));
    gw.shutdown().await;
}

/// The quiet leak: the engine answers from stale pages with the right `prompt_tokens`, a
/// normal finish and no marker, so every other guard check passes. Bob's token-id prompt is
/// as long as Alice's, so his request gets her freed pages back in order.
async fn silent_leak(
    pool_extra: &str,
    stream: bool,
) -> (Reply, kvgate::runtime::app::RunningGateway) {
    let engine = engine(SimRole::Unified, SimFault::SilentLeak, 40960, 32768).await;
    let pools = format!(
        "{}{pool_extra}",
        unified_pool("u", &[worker(&engine, None)])
    );
    let gw = gateway(&two_tenants(&pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let a = json!({"text": format!("{} The secret code is {SECRET}.", "lorem ".repeat(300)), "sampling_params": {"max_new_tokens": 24}});
    let alice = post(&url, Some("sk-alice"), &a).await;
    assert_eq!(alice.status, 200, "{}", alice.text());
    let len = alice.json()["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
    let b = json!({"input_ids": vec![1000u32; len], "stream": stream, "sampling_params": {"max_new_tokens": 24}});
    (post(&url, Some("sk-bob"), &b).await, gw)
}

#[tokio::test]
async fn the_default_config_stops_a_leak_with_the_right_usage_and_no_marker() {
    // Without the leak detector the secret reaches Bob with a 200: the fault is real.
    let (b, gw) = silent_leak("leak_detection = \"off\"\n", false).await;
    assert_eq!(b.status, 200, "{}", b.text());
    assert!(b.text().contains("QUOKKA"), "{}", b.text());
    gw.shutdown().await;
    // The default config (no leak_detection key: block) stops it, whole or streamed.
    for stream in [false, true] {
        let (b, gw) = silent_leak("", stream).await;
        assert_leak_stopped(&b, stream);
        assert!(gw
            .audit()
            .recent()
            .iter()
            .any(|l| l["event"] == "leak_suspected"));
        gw.shutdown().await;
    }
}
