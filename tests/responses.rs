//! `/v1/responses` through the same front door: counted as SGLang builds the chat from it,
//! admitted and guarded; a stored response belongs to the tenant that created it (another
//! tenant gets 404 for its continuation, its GET and its cancel) and lives on one worker,
//! where every request naming it goes.

mod support;
mod support_redis;

use serde_json::{json, Value};
use support::*;

use kvgate_sim::{SimConfig, SimFault, SimRole};

const WINDOW: u64 = 2048;
const OTHER_KEY: &str = "kvgate-other-tenant-key";

async fn setup(
    fault: SimFault,
) -> (
    kvgate_sim::RunningSim,
    kvgate_sim::RunningSim,
    kvgate::runtime::RunningGateway,
) {
    // SGLang keeps responses only with `--enable-response-store`.
    let sim = || SimConfig {
        role: SimRole::Unified,
        fault,
        kv_tokens: 40960,
        context_length: 32768,
        model: "qwen3".into(),
        enable_response_store: true,
        ..SimConfig::default()
    };
    let a = engine_with(sim()).await;
    let b = engine_with(sim()).await;
    let text = config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&a, None), worker(&b, None)]),
    ) + "\n"
        + &tenant_table("t2", OTHER_KEY);
    (a, b, gateway(&text).await)
}

fn url(gw: &kvgate::runtime::RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gw.data_addr())
}

fn responses_received(engine: &kvgate_sim::RunningSim) -> Vec<Value> {
    engine
        .engine
        .received()
        .into_iter()
        .filter(|r| r.path.starts_with("/v1/responses"))
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn a_stored_response_is_its_tenants_and_lives_on_its_worker() {
    let (a, b, gw) = setup(SimFault::None).await;
    let first = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Name a colour.", "instructions": "Be brief.",
                "max_output_tokens": 16}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let answer = first.json();
    let id = answer["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"), "{answer}");
    // Finished (its 16-token budget may cut it short: `incomplete`).
    assert!(
        ["completed", "incomplete"].contains(&answer["status"].as_str().unwrap()),
        "{answer}"
    );
    // The engine got kvgate's id, the tenant's salt, and no `rid`.
    let (holder, other) = if responses_received(&a).is_empty() {
        (&b, &a)
    } else {
        (&a, &b)
    };
    let sent = &responses_received(holder)[0];
    assert_eq!(sent["request_id"], id.as_str());
    assert!(
        sent.get("cache_salt").is_some() && sent.get("rid").is_none(),
        "{sent}"
    );

    // Continuations go to the worker holding the conversation, every time.
    for turn in 0..3 {
        let next = post(
            &url(&gw, "/v1/responses"),
            Some(KEY),
            &json!({"model": "qwen3", "input": format!("And another, {turn}?"),
                    "previous_response_id": id, "max_output_tokens": 16}),
        )
        .await;
        assert_eq!(next.status, 200, "{}", next.text());
    }
    assert_eq!(responses_received(holder).len(), 4);
    assert!(responses_received(other).is_empty());
    let got = get(&url(&gw, &format!("/v1/responses/{id}")), Some(KEY)).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["id"], id.as_str());
    let asked = responses_received(holder).len();
    assert_eq!(asked, 5, "four turns and the GET, all on the holder");

    // Another tenant cannot continue it, read it or cancel it: 404, as if it did not exist.
    let stolen = post(
        &url(&gw, "/v1/responses"),
        Some(OTHER_KEY),
        &json!({"model": "qwen3", "input": "What did they ask?", "previous_response_id": id}),
    )
    .await;
    assert_eq!(stolen.status, 404, "{}", stolen.text());
    assert_eq!(error_code(&stolen), "response_not_found");
    let read = get(&url(&gw, &format!("/v1/responses/{id}")), Some(OTHER_KEY)).await;
    assert_eq!(read.status, 404, "{}", read.text());
    let cancel = post(
        &url(&gw, &format!("/v1/responses/{id}/cancel")),
        Some(OTHER_KEY),
        &json!({}),
    )
    .await;
    assert_eq!(cancel.status, 404, "{}", cancel.text());
    let unknown = get(&url(&gw, "/v1/responses/resp_nobody"), Some(KEY)).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        responses_received(holder).len(),
        asked,
        "none of that reached an engine"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn responses_are_counted_refused_over_the_limit_and_streams_guarded() {
    let (a, b, gw) = setup(SimFault::None).await;
    let long = "word ".repeat(3000);
    let refused = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": long, "max_output_tokens": 16}),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(error_code(&refused), "context_length_exceeded");
    let own_id = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "x", "request_id": "resp_mine"}),
    )
    .await;
    assert_eq!(error_code(&own_id), "unsupported_parameter");
    let builtin = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "x", "tools": [{"type": "web_search"}]}),
    )
    .await;
    assert_eq!(builtin.status, 400, "{}", builtin.text());
    assert!(
        builtin.text().contains("only `function` tools"),
        "{}",
        builtin.text()
    );
    assert!(responses_received(&a).is_empty() && responses_received(&b).is_empty());
    // Items, a tool and a tool loop turn: counted as SGLang builds the chat (the guard
    // holds the engine's input_tokens to kvgate's count, so a 200 means they agree).
    let tools = json!([{"type": "function", "name": "get_weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let items = json!([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "{\"temperature\": 21}"},
    ]);
    let reply = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": items, "tools": tools, "max_output_tokens": 16, "store": false}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // No `max_output_tokens`: what fits the window is admitted and sent (SGLang samples
    // two fewer than `max_output_tokens`), so the engine cannot run past it.
    let open = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Say hi.", "store": false}),
    )
    .await;
    assert_eq!(open.status, 200, "{}", open.text());
    let allowed: u64 = open.headers["x-kvgate-max-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let sent: Vec<Value> = [&a, &b]
        .iter()
        .flat_map(|e| responses_received(e))
        .collect();
    let last = sent
        .iter()
        .find(|r| r["input"] == "Say hi.")
        .expect("the engine got it");
    assert_eq!(last["max_output_tokens"], allowed + 2, "{last}");
    assert!(allowed < WINDOW);
    // Streamed: the engine's events, ending in response.completed.
    let streamed = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Count to three.", "max_output_tokens": 16, "stream": true}),
    )
    .await;
    assert_eq!(streamed.status, 200);
    let text = streamed.text();
    assert!(text.contains("event: response.created"), "{text}");
    let finals = ["event: response.completed", "event: response.incomplete"];
    assert!(finals.iter().any(|f| text.contains(f)), "{text}");
    assert!(!text.contains("event: error"), "{text}");
    gw.shutdown().await;

    // An engine failing mid-stream: an error event, never response.completed.
    let (_a, _b, gw) = setup(SimFault::ErrorEvent).await;
    let streamed = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Count to three.", "max_output_tokens": 16, "stream": true}),
    )
    .await;
    let text = streamed.text();
    assert!(text.contains("event: error"), "{text}");
    assert!(
        !text.contains("response.completed") && !text.contains("response.incomplete"),
        "{text}"
    );
    gw.shutdown().await;
    // An abort without a status: a 200 whose response `failed`, never passed on as one.
    let (_a, _b, gw) = setup(SimFault::AbortNoStatus).await;
    let whole = post(
        &url(&gw, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "hi", "max_output_tokens": 16}),
    )
    .await;
    assert!(whole.status.is_server_error(), "{}", whole.text());
    gw.shutdown().await;
}

/// Two replicas sharing the limits' Redis: a response created through one is continued
/// through the other on the worker that holds it, and is still only its tenant's.
#[tokio::test]
async fn replicas_sharing_redis_share_who_owns_each_response() {
    let redis = support_redis::RedisServer::start();
    let sim = || SimConfig {
        role: SimRole::Unified,
        kv_tokens: 40960,
        context_length: 32768,
        model: "qwen3".into(),
        enable_response_store: true,
        ..SimConfig::default()
    };
    let (a, b) = (engine_with(sim()).await, engine_with(sim()).await);
    let text = format!(
        "[limits]\nbackend = \"redis\"\nredis_url = \"{}\"\n",
        redis.url()
    ) + &config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&a, None), worker(&b, None)]),
    ) + "\n"
        + &tenant_table("t2", OTHER_KEY);
    let (one, two) = (gateway(&text).await, gateway(&text).await);
    let first = post(
        &url(&one, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Name a colour.", "max_output_tokens": 16}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let id = first.json()["id"].as_str().unwrap().to_owned();
    let holder = if responses_received(&a).is_empty() {
        &b
    } else {
        &a
    };
    let next = post(
        &url(&two, "/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Another?", "previous_response_id": id, "max_output_tokens": 16}),
    )
    .await;
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(
        responses_received(holder).len(),
        2,
        "the other replica sent it to the holder"
    );
    let stolen = get(&url(&two, &format!("/v1/responses/{id}")), Some(OTHER_KEY)).await;
    assert_eq!(stolen.status, 404, "{}", stolen.text());
    one.shutdown().await;
    two.shutdown().await;
}
