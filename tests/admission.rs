//! Admission end to end (I2, I3, I4): prompts at limit − 1 and at the limit pass, limit + 1
//! is refused with 400 `context_length_exceeded` before any byte reaches an engine — for
//! every endpoint, streaming and not, unified and prefill/decode, chat template included —
//! and the incident's configuration is made harmless.

mod support;

use serde_json::{json, Value};
use support::*;

use kvgate_sim::{RunningSim, SimFault, SimRole};

const WINDOW: u64 = 32768;
/// Prefill-side KV pool of the test pools: max_req_input_len = min(W-1, 999) - 5 = 994,
/// so the largest admitted prompt is 993 tokens.
const POOL: usize = 1000;
const LIMIT: usize = 993;

/// A text of exactly `n` tokens (checked with the real tokenizer).
fn text_of(n: usize) -> String {
    let text = format!("hello{}", " hello".repeat(n.saturating_sub(1)));
    assert_eq!(qwen3().count(&text, true).unwrap(), n);
    text
}

/// Chat messages whose rendered prompt has exactly `n` tokens.
fn chat_of(n: usize) -> Value {
    let tk = qwen3();
    let render = |words: usize| {
        let messages = json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": text_of(words)}]);
        let rendered = tk.apply_chat_template(&messages, None, true).unwrap();
        (messages, tk.count(&rendered, false).unwrap())
    };
    let (_, one) = render(1);
    let (messages, count) = render(n + 1 - one);
    assert_eq!(count, n);
    messages
}

fn body(path: &str, n: usize, stream: bool, ids: bool) -> Value {
    match (path, ids) {
        ("/v1/chat/completions", _) => {
            json!({"model": "qwen3", "stream": stream, "max_tokens": 1, "messages": chat_of(n)})
        }
        ("/v1/completions", false) => {
            json!({"model": "qwen3", "stream": stream, "max_tokens": 1, "prompt": text_of(n)})
        }
        ("/v1/completions", true) => {
            json!({"model": "qwen3", "stream": stream, "max_tokens": 1, "prompt": vec![9707u32; n]})
        }
        (_, false) => {
            json!({"stream": stream, "text": text_of(n), "sampling_params": {"max_new_tokens": 1}})
        }
        (_, true) => {
            json!({"stream": stream, "input_ids": vec![9707u32; n], "sampling_params": {"max_new_tokens": 1}})
        }
    }
}

fn generations_of(engines: &[&RunningSim]) -> usize {
    engines.iter().map(|e| generations(e).len()).sum()
}

async fn boundaries(base: &str, engines: &[&RunningSim]) {
    let cases = [
        ("/v1/chat/completions", false),
        ("/v1/completions", false),
        ("/v1/completions", true),
        ("/generate", false),
        ("/generate", true),
    ];
    for (path, ids) in cases {
        for stream in [false, true] {
            for n in [LIMIT - 1, LIMIT] {
                let reply = post(
                    &format!("{base}{path}"),
                    Some(KEY),
                    &body(path, n, stream, ids),
                )
                .await;
                assert_eq!(
                    reply.status,
                    200,
                    "{path} ids={ids} stream={stream} n={n}: {}",
                    reply.text()
                );
                if !stream {
                    // The engine counted exactly what the gateway counted.
                    let v = reply.json();
                    let reported = v["usage"]["prompt_tokens"]
                        .as_u64()
                        .or_else(|| v["meta_info"]["prompt_tokens"].as_u64());
                    assert_eq!(reported, Some(n as u64), "{path}: {v}");
                }
            }
            let before = generations_of(engines);
            let reply = post(
                &format!("{base}{path}"),
                Some(KEY),
                &body(path, LIMIT + 1, stream, ids),
            )
            .await;
            assert_eq!(
                reply.status,
                400,
                "{path} ids={ids} stream={stream}: {}",
                reply.text()
            );
            assert_eq!(error_code(&reply), "context_length_exceeded");
            let err = &reply.json()["error"];
            assert_eq!(err["type"], "invalid_request_error");
            let message = err["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("{} tokens", LIMIT + 1))
                    && message.contains(&format!("limit of {LIMIT}")),
                "{message}"
            );
            assert!(
                message.contains("prefill worker") || message.contains("the input limit of"),
                "{message}"
            );
            assert_eq!(
                generations_of(engines),
                before,
                "{path}: a refused request reached an engine"
            );
        }
    }
}

#[tokio::test]
async fn unified_pool_boundaries_on_every_endpoint() {
    let engine = engine(SimRole::Unified, SimFault::None, POOL, WINDOW as usize).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    boundaries(&format!("http://{}", gw.data_addr()), &[&engine]).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn pd_pool_boundaries_on_every_endpoint() {
    let prefill = engine(SimRole::Prefill, SimFault::None, POOL, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    boundaries(&format!("http://{}", gw.data_addr()), &[&prefill, &decode]).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_smallest_worker_and_the_decode_pool_bound_the_pool() {
    // Two prefill workers: the smaller one sets the limit whichever is picked.
    let small = engine(SimRole::Prefill, SimFault::None, POOL, WINDOW as usize).await;
    let large = engine(SimRole::Prefill, SimFault::None, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 2000, WINDOW as usize).await;
    let pools = pd_pool(
        "pd",
        &[worker(&large, None), worker(&small, None)],
        &[worker(&decode, None)],
    );
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let url = format!("http://{}/generate", gw.data_addr());
    for _ in 0..3 {
        let reply = post(
            &url,
            Some(KEY),
            &json!({"input_ids": vec![1u32; LIMIT + 1], "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        // The smaller worker's limit, named by its pool; no worker address reaches the client.
        assert!(
            reply
                .text()
                .contains(&format!("over the limit of {LIMIT} tokens"))
                && reply.text().contains("prefill workers of pool `pd`")
                && !reply.text().contains(&small.http_addr.to_string()),
            "{}",
            reply.text()
        );
    }
    // Prompt + max new tokens over the decode pool (2000): refused, naming the decode side.
    let reply = post(
        &url,
        Some(KEY),
        &json!({"input_ids": vec![1u32; 900], "sampling_params": {"max_new_tokens": 1101}}),
    )
    .await;
    assert_eq!(reply.status, 400);
    let message = error_message(&reply);
    assert!(
        message.contains("decode workers") && message.contains("2001 tokens in all"),
        "{message}"
    );
    let reply = post(
        &url,
        Some(KEY),
        &json!({"input_ids": vec![1u32; 900], "sampling_params": {"max_new_tokens": 1100}}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // A batch names the sample that does not fit.
    let reply = post(&url, Some(KEY), &json!({"input_ids": [vec![1u32; 10], vec![1u32; LIMIT + 5]], "sampling_params": {"max_new_tokens": 1}})).await;
    assert_eq!(reply.status, 400);
    assert!(reply.text().contains("sample 1"), "{}", reply.text());
    assert_eq!(
        generations(&small).len() + generations(&large).len(),
        1,
        "only the one admitted request reached prefill"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_incident_configuration_is_refused_one_token_over_and_served_at_the_limit() {
    // config/incident.toml: window 1,048,576, prefill pool 681,280 → limit 681,273.
    let prefill = engine(SimRole::Prefill, SimFault::Incident, 681_280, 1_048_576).await;
    let decode = engine(SimRole::Decode, SimFault::Incident, 1_048_576, 1_048_576).await;
    let text = std::fs::read_to_string(repo().join("config/incident.toml")).unwrap();
    let text = text
        .replace(
            "http://127.0.0.1:30110",
            &format!("http://{}", prefill.http_addr),
        )
        .replace(
            "bootstrap_port = 30111",
            &format!(
                "bootstrap_port = {}",
                prefill.bootstrap_addr.unwrap().port()
            ),
        )
        .replace(
            "http://127.0.0.1:30120",
            &format!("http://{}", decode.http_addr),
        );
    let mut config = parse_config(&text);
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    let gw = kvgate::runtime::Gateway::new(config)
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap();
    let url = format!("http://{}/generate", gw.data_addr());

    let over = post(
        &url,
        Some(KEY),
        &json!({"input_ids": vec![9707u32; 681_274], "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(over.status, 400, "{}", over.text());
    assert_eq!(error_code(&over), "context_length_exceeded");
    assert!(
        over.text().contains("681274 tokens") && over.text().contains("limit of 681273"),
        "{}",
        over.text()
    );
    assert_eq!(
        generations(&prefill).len() + generations(&decode).len(),
        0,
        "zero requests reached the engines"
    );

    let at = post(
        &url,
        Some(KEY),
        &json!({"input_ids": vec![9707u32; 681_273], "sampling_params": {"max_new_tokens": 1}}),
    )
    .await;
    assert_eq!(at.status, 200, "{}", &at.text()[..at.text().len().min(500)]);
    assert_eq!(at.json()["meta_info"]["prompt_tokens"], 681_273);
    gw.shutdown().await;
}

#[tokio::test]
async fn strict_admission_refuses_to_start_on_the_incident_configuration() {
    let text = std::fs::read_to_string(repo().join("config/incident.toml")).unwrap()
        + "\n[admission]\nstrict = true\n";
    let config = parse_config(&text);
    let err = kvgate::runtime::Gateway::new(config)
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("incident"), "{err}");
}
