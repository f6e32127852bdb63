//! The routes beyond chat, completions and `/generate`, through the same front door:
//! embeddings, rerank and score are counted input by input as SGLang builds them, refused
//! over the limit before any byte reaches an engine, and their answers guarded;
//! `/tokenize` and `/detokenize` are answered by kvgate itself, exactly as the engine would.

mod support;

use serde_json::{json, Value};
use support::*;

use kvgate_sim::{SimConfig, SimFault, SimRole};

/// The model's window in the gateway: small, so an over-long input is easy to write.
const WINDOW: u64 = 256;

async fn setup(fault: SimFault) -> (kvgate_sim::RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine(SimRole::Unified, fault, 40960, 4096).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    (engine, gw)
}

fn url(gw: &kvgate::runtime::RunningGateway, path: &str) -> String {
    format!("http://{}{path}", gw.data_addr())
}

fn count(text: &str) -> u64 {
    qwen3().count(text, true).unwrap() as u64
}

/// What the engine received on `path`.
fn received(engine: &kvgate_sim::RunningSim, path: &str) -> Vec<Value> {
    engine
        .engine
        .received()
        .into_iter()
        .filter(|r| r.path == path)
        .map(|r| r.body)
        .collect()
}

#[tokio::test]
async fn embeddings_are_counted_per_input_and_refused_over_the_limit() {
    let (engine, gw) = setup(SimFault::None).await;
    let u = url(&gw, "/v1/embeddings");
    for (input, counts) in [
        (json!("hello world"), vec![count("hello world")]),
        (
            json!(["a cache", "of pages"]),
            vec![count("a cache"), count("of pages")],
        ),
        (json!([1, 2, 3]), vec![3]),
        (json!([[1, 2], [3]]), vec![2, 1]),
    ] {
        let reply = post(&u, Some(KEY), &json!({"model": "qwen3", "input": input})).await;
        assert_eq!(reply.status, 200, "{input}: {}", reply.text());
        let body = reply.json();
        assert_eq!(body["data"].as_array().unwrap().len(), counts.len());
        assert_eq!(body["usage"]["prompt_tokens"], counts.iter().sum::<u64>());
    }
    // What the engine got: its own model name and request ids, no new-token allowance and
    // no cache salt (SGLang's EmbeddingRequest takes none).
    let sent = received(&engine, "/v1/embeddings");
    assert_eq!(sent.len(), 4);
    let last = &sent[3];
    assert_eq!(last["model"], "qwen3");
    assert_eq!(last["rid"].as_array().map(Vec::len), Some(2), "{last}");
    for absent in ["max_tokens", "cache_salt", "extra_key"] {
        assert!(last.get(absent).is_none(), "{absent} in {last}");
    }
    // One input over the window: 400 naming `input`, and nothing reaches the engine.
    let long = "word ".repeat(400);
    let refused = post(
        &u,
        Some(KEY),
        &json!({"model": "qwen3", "input": ["short", long]}),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(error_code(&refused), "context_length_exceeded");
    assert_eq!(refused.json()["error"]["param"], "input");
    assert!(
        error_message(&refused).contains("sample 1"),
        "{}",
        refused.text()
    );
    let streamed = post(
        &u,
        Some(KEY),
        &json!({"model": "qwen3", "input": "x", "stream": true}),
    )
    .await;
    assert_eq!(streamed.status, 400);
    assert_eq!(error_code(&streamed), "unsupported_parameter");
    let empty = post(&u, Some(KEY), &json!({"model": "qwen3", "input": []})).await;
    assert_eq!(empty.status, 400);
    assert_eq!(received(&engine, "/v1/embeddings").len(), 4);
    gw.shutdown().await;
}

#[tokio::test]
async fn rerank_pairs_and_score_prompts_are_counted_as_sglang_builds_them() {
    let (engine, gw) = setup(SimFault::None).await;
    let query = "what holds the keys";
    let documents = ["a cache holds pages of keys", "bananas are yellow"];
    let reply = post(
        &url(&gw, "/v1/rerank"),
        Some(KEY),
        &json!({"query": query, "documents": documents}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let results = reply.json();
    let results = results.as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        let i = r["index"].as_u64().unwrap() as usize;
        // Each pair: the query's ids then the document's, each with special tokens.
        assert_eq!(
            r["meta_info"]["prompt_tokens"],
            count(query) + count(documents[i])
        );
    }
    let sent = &received(&engine, "/v1/rerank")[0];
    assert!(
        sent.get("model").is_none() && sent.get("rid").is_none(),
        "{sent}"
    );
    let long = "word ".repeat(400);
    let refused = post(
        &url(&gw, "/v1/rerank"),
        Some(KEY),
        &json!({"query": query, "documents": ["ok", long]}),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(error_code(&refused), "context_length_exceeded");
    assert_eq!(refused.json()["error"]["param"], "documents");
    let instruct = post(
        &url(&gw, "/v1/rerank"),
        Some(KEY),
        &json!({"query": query, "documents": ["a"], "instruct": "judge"}),
    )
    .await;
    assert_eq!(error_code(&instruct), "unsupported_parameter");
    assert_eq!(received(&engine, "/v1/rerank").len(), 1);

    // Score: text query and items joined (`f"{query}{item}"`), encoded with specials.
    let labels = qwen3().encode(" yes", false).unwrap();
    let reply = post(
        &url(&gw, "/v1/score"),
        Some(KEY),
        &json!({"query": "Is the sky blue?", "items": [" Yes", " No"], "label_token_ids": labels}),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["scores"].as_array().unwrap().len(), 2);
    assert_eq!(
        body["usage"]["prompt_tokens"],
        count("Is the sky blue? Yes") + count("Is the sky blue? No")
    );
    let refused = post(
        &url(&gw, "/v1/score"),
        Some(KEY),
        &json!({"query": long, "items": ["a"], "label_token_ids": labels}),
    )
    .await;
    assert_eq!(error_code(&refused), "context_length_exceeded");
    assert_eq!(received(&engine, "/v1/score").len(), 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn tokenize_and_detokenize_are_answered_by_kvgate_as_the_engine_answers_them() {
    let engine = engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: 40960,
        context_length: 4096,
        ..SimConfig::default()
    })
    .await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let direct = format!("http://{}/tokenize", engine.http_addr);
    let chat = json!({
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "what is 2+2?"},
        ],
        "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    for body in [
        json!({"prompt": "hello world"}),
        json!({"prompt": ["one", "two three"], "add_special_tokens": false}),
        chat,
    ] {
        let ours = post(&url(&gw, "/tokenize"), Some(KEY), &body).await;
        let theirs = post(&direct, None, &body).await;
        assert_eq!(ours.status, 200, "{body}: {}", ours.text());
        assert_eq!(theirs.status, 200, "{body}: {}", theirs.text());
        assert_eq!(ours.json()["tokens"], theirs.json()["tokens"], "{body}");
        assert_eq!(ours.json()["count"], theirs.json()["count"], "{body}");
        assert_eq!(ours.json()["max_model_len"], WINDOW);
    }
    let ids = qwen3().encode("round trip", true).unwrap();
    let text = post(
        &url(&gw, "/v1/detokenize"),
        Some(KEY),
        &json!({"tokens": ids}),
    )
    .await;
    assert_eq!(text.json(), json!({"text": "round trip"}));
    let texts = post(
        &url(&gw, "/detokenize"),
        Some(KEY),
        &json!({"tokens": [ids, [9707]]}),
    )
    .await;
    assert_eq!(texts.json()["text"].as_array().map(Vec::len), Some(2));
    let bad = post(
        &url(&gw, "/detokenize"),
        Some(KEY),
        &json!({"tokens": [999999999]}),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.text());
    let both = post(
        &url(&gw, "/tokenize"),
        Some(KEY),
        &json!({"prompt": "a", "messages": []}),
    )
    .await;
    assert_eq!(both.status, 400);
    let stranger = post(&url(&gw, "/tokenize"), None, &json!({"prompt": "a"})).await;
    assert_eq!(stranger.status, 401);
    // None of it reached the engine through the gateway.
    let via_gateway = engine
        .engine
        .received()
        .into_iter()
        .filter(|r| r.path.contains("tokenize") && r.headers.contains_key("x-request-id"))
        .count();
    assert_eq!(via_gateway, 0);
    assert_eq!(
        received(&engine, "/tokenize").len(),
        3,
        "only the direct asks"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_guard_stops_an_error_inside_a_200_and_a_wrong_count_on_every_prefill_only_route() {
    let labels = qwen3().encode(" yes", false).unwrap();
    let requests = [
        (
            "/v1/embeddings",
            json!({"model": "qwen3", "input": "hello"}),
        ),
        ("/v1/rerank", json!({"query": "q", "documents": ["d"]})),
        (
            "/v1/score",
            json!({"query": "q", "items": ["i"], "label_token_ids": labels}),
        ),
    ];
    for fault in [SimFault::ErrorEvent, SimFault::WrongPromptTokens] {
        let (engine, gw) = setup(fault).await;
        for (path, body) in &requests {
            let reply = post(&url(&gw, path), Some(KEY), body).await;
            assert!(
                reply.status.is_server_error(),
                "{fault:?} {path}: {} {}",
                reply.status,
                reply.text()
            );
            assert_eq!(received(&engine, path).len(), 1, "{fault:?} {path}");
        }
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn prefill_only_routes_on_a_pd_pool_get_a_400_that_says_what_they_need() {
    let prefill = engine(SimRole::Prefill, SimFault::None, 40960, 4096).await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, 4096).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]),
    ))
    .await;
    let reply = post(
        &url(&gw, "/v1/embeddings"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "x"}),
    )
    .await;
    // No worker state would change it: a 400 that says what the route needs.
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("needs a unified pool"),
        "{}",
        reply.text()
    );
    let score = post(
        &url(&gw, "/v1/score"),
        Some(KEY),
        &json!({"query": "q", "items": ["i"], "label_token_ids": [1]}),
    )
    .await;
    assert!(
        score.text().contains("needs a unified SGLang pool"),
        "{}",
        score.text()
    );
    // /generate on a PD pool is served as ever.
    let generate = post(
        &url(&gw, "/generate"),
        Some(KEY),
        &json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(generate.status, 200, "{}", generate.text());
    gw.shutdown().await;
}
