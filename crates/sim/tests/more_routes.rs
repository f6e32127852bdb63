//! The sim's routes beyond generation, over real HTTP to an in-process sim, in SGLang's
//! shapes (sglang 0.5.23): `/v1/embeddings`, `/v1/rerank`, `/v1/score`, `/tokenize` and
//! `/detokenize`, and the Responses API (`/v1/responses`, plain and streamed, stored,
//! continued, in the background and cancelled), errors and faults included.

mod support;

use serde_json::{json, Value};
use support::*;

const QUESTION: &str = "What is the weather like in Paris this week?";

fn store_config() -> SimConfig {
    SimConfig {
        enable_response_store: true,
        ..config(SimRole::Unified)
    }
}

/// `POST` with a content type of our choosing; `None` when the engine dropped the
/// connection.
async fn post_as(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: &Value,
) -> Option<(StatusCode, Value)> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.ok()?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    Some((
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    ))
}

/// A 400 in SGLang's `ErrorResponse` shape with this type, whose message contains `text`.
fn assert_error(status: StatusCode, body: &Value, code: u16, kind: &str, text: &str) {
    assert_eq!(status.as_u16(), code, "{body}");
    assert_eq!(body["object"], "error", "{body}");
    assert_eq!(body["type"], kind, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["param"], Value::Null, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains(text), "{message:?} lacks {text:?}");
}

/// A `/v1/responses` error: `{"error": {message, type, param, code}}`.
fn assert_responses_error(status: StatusCode, body: &Value, code: u16, param: Value, text: &str) {
    assert_eq!(status.as_u16(), code, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert_eq!(error["param"], param, "{body}");
    assert!(error["message"].as_str().unwrap().contains(text), "{body}");
}

fn ids(text: &str) -> Vec<u32> {
    QWEN3.encode(text, true).unwrap()
}

fn vector(item: &Value) -> Vec<f64> {
    item["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn base64_floats(text: &str) -> Vec<f64> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            _ => 63,
        }
    };
    let mut bytes = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk.iter().fold(0u32, |n, &c| {
            (n << 6) | if c == b'=' { 0 } else { value(c) }
        });
        bytes.extend(&n.to_be_bytes()[1..4 - pad]);
    }
    bytes
        .chunks(4)
        .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect()
}

#[tokio::test]
async fn tokenize_and_detokenize_answer_in_sglangs_shapes() {
    let sim = start(SimConfig {
        model_max_length: Some(131_072),
        ..config(SimRole::Unified)
    })
    .await;
    let addr = sim.http_addr;
    for path in ["/tokenize", "/v1/tokenize"] {
        let (status, out) = post(addr, path, &json!({"prompt": PROMPT})).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(
            out,
            json!({"tokens": ids(PROMPT), "count": ids(PROMPT).len(), "max_model_len": 131072})
        );
    }
    let (_, out) = post(
        addr,
        "/tokenize",
        &json!({"prompt": ["one two", PROMPT], "add_special_tokens": false}),
    )
    .await;
    let lists = [
        QWEN3.encode("one two", false).unwrap(),
        QWEN3.encode(PROMPT, false).unwrap(),
    ];
    assert_eq!(out["tokens"], json!(lists));
    assert_eq!(out["count"], json!([lists[0].len(), lists[1].len()]));
    // `messages` are rendered as for a chat completion.
    let chat = json!({"messages": [{"role": "user", "content": QUESTION}], "chat_template_kwargs": {"enable_thinking": false}});
    let (_, out) = post(addr, "/tokenize", &chat).await;
    assert_eq!(out["tokens"], json!(chat_prompt_ids(&chat)), "{out}");
    for bad in [
        json!({}),
        json!({"prompt": "a", "messages": []}),
        json!({"prompt": 3}),
    ] {
        let (status, out) = post(addr, "/tokenize", &bad).await;
        assert_error(status, &out, 400, "Bad Request", "validation error");
    }
    let (status, out) = post_as(addr, "/tokenize", "text/plain", &json!({"prompt": "a"}))
        .await
        .unwrap();
    assert_error(
        status,
        &out,
        400,
        "Bad Request",
        "Only 'application/json' is allowed",
    );
    let (status, out) = get(addr, "/tokenize").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{out}");

    let prompt = ids(PROMPT);
    for path in ["/detokenize", "/v1/detokenize"] {
        let (status, out) = post(addr, path, &json!({"tokens": prompt})).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out, json!({"text": PROMPT}));
    }
    let (_, out) = post(addr, "/detokenize", &json!({"tokens": [prompt, []]})).await;
    assert_eq!(out, json!({"text": [PROMPT, ""]}));
    let (_, out) = post(addr, "/detokenize", &json!({"tokens": []})).await;
    assert_eq!(out, json!({"text": ""}));
    let im_end = QWEN3.eos_token_id().unwrap();
    let (_, out) = post(
        addr,
        "/detokenize",
        &json!({"tokens": [im_end], "skip_special_tokens": false}),
    )
    .await;
    assert_eq!(out, json!({"text": "<|im_end|>"}));
    let (status, out) = post(addr, "/detokenize", &json!({"tokens": [1, -5]})).await;
    assert_error(status, &out, 500, "InternalServerError", "negative");
    let (status, out) = post(addr, "/detokenize", &json!({"tokens": "abc"})).await;
    assert_error(status, &out, 400, "Bad Request", "tokens");
    // Every request reached the engine's log, whatever its answer.
    let paths: Vec<String> = sim.engine.received().into_iter().map(|r| r.path).collect();
    assert!(paths.iter().filter(|p| p.ends_with("tokenize")).count() >= 8);
    assert!(paths.iter().any(|p| p == "/v1/detokenize"));
    sim.shutdown().await;
}

#[tokio::test]
async fn embeddings_are_counted_normalized_and_deterministic() {
    let sim = start(config(SimRole::Unified)).await;
    let addr = sim.http_addr;
    let (status, out) = post(
        addr,
        "/v1/embeddings",
        &json!({"model": MODEL, "input": PROMPT}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["object"], "list");
    assert_eq!(out["model"], MODEL);
    let n = ids(PROMPT).len();
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
               "prompt_tokens_details": null, "reasoning_tokens": 0, "completion_tokens_details": null})
    );
    let item = &out["data"][0];
    assert_eq!(item["object"], "embedding");
    assert_eq!(item["index"], 0);
    let one = vector(item);
    assert_eq!(one.len(), 64);
    assert!((norm(&one) - 1.0).abs() < 1e-5);

    // A batch of texts, ids and id lists: each counted, the same prompt the same vector.
    let other = "A different sentence about the weather.";
    let (_, out) = post(addr, "/v1/embeddings", &json!({"input": [PROMPT, other]})).await;
    assert_eq!(out["usage"]["prompt_tokens"], n + ids(other).len());
    assert_eq!(vector(&out["data"][0]), one);
    assert_eq!(out["data"][1]["index"], 1);
    assert_ne!(vector(&out["data"][1]), one);
    let (_, out) = post(addr, "/v1/embeddings", &json!({"input": ids(PROMPT)})).await;
    assert_eq!(vector(&out["data"][0]), one);
    let (_, out) = post(
        addr,
        "/v1/embeddings",
        &json!({"input": [ids(PROMPT), ids(other)]}),
    )
    .await;
    assert_eq!(out["data"].as_array().unwrap().len(), 2);
    assert_eq!(vector(&out["data"][0]), one);

    // Matryoshka dimensions, then base64 (little-endian float32).
    let (_, out) = post(
        addr,
        "/v1/embeddings",
        &json!({"input": PROMPT, "dimensions": 16}),
    )
    .await;
    let short = vector(&out["data"][0]);
    assert_eq!(short.len(), 16);
    assert!((norm(&short) - 1.0).abs() < 1e-5);
    let (_, out) = post(
        addr,
        "/v1/embeddings",
        &json!({"input": PROMPT, "encoding_format": "base64"}),
    )
    .await;
    // The same float32 values (JSON's decimal text parses back to the same f32).
    let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    let decoded = base64_floats(out["data"][0]["embedding"].as_str().unwrap());
    assert_eq!(as_f32(&decoded), as_f32(&one));

    for (input, text) in [
        (json!({"input": ""}), "Input cannot be empty"),
        (
            json!({"input": "   "}),
            "Input cannot be empty or whitespace only",
        ),
        (
            json!({"input": ["a", " "]}),
            "Input at index 1 cannot be empty or whitespace only",
        ),
        (
            json!({"input": [1, -2]}),
            "Token ID at index 1 must be non-negative",
        ),
        (
            json!({"input": "a", "encoding_format": "hex"}),
            "encoding_format must be either 'float' or 'base64', got 'hex'",
        ),
        (
            json!({"input": "a", "dimensions": 0}),
            "Requested dimensions must be greater than 0",
        ),
        (
            json!({"input": "a", "dimensions": 65}),
            "Provided dimensions are greater than max embedding dimension: 64",
        ),
    ] {
        let (status, out) = post(addr, "/v1/embeddings", &input).await;
        assert_error(status, &out, 400, "BadRequestError", text);
    }
    let (status, out) = post(addr, "/v1/embeddings", &json!({"model": MODEL})).await;
    assert_error(status, &out, 400, "Bad Request", "input: Field required");

    // Over the context (8192), then over the pool's max_req_input_len (4090): refused.
    let word_ids = ids(" paged");
    let over =
        |n: usize| json!({"input": word_ids.iter().cycle().take(n).copied().collect::<Vec<_>>()});
    let (status, out) = post(addr, "/v1/embeddings", &over(9000)).await;
    assert_error(
        status,
        &out,
        400,
        "BadRequestError",
        "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
    );
    let (status, out) = post(addr, "/v1/embeddings", &over(5000)).await;
    assert_error(
        status,
        &out,
        400,
        "BadRequestError",
        "Input length (5000 tokens) exceeds the maximum allowed length (4090 tokens)",
    );
    assert_eq!(sim.engine.used_kv_tokens(), 0);
    let received = sim.engine.received();
    let last = received.last().unwrap();
    assert_eq!(last.path, "/v1/embeddings");
    assert_eq!(last.body["input"].as_array().unwrap().len(), 5000);
    sim.shutdown().await;
}

#[tokio::test]
async fn embedding_faults_fail_as_the_engine_would() {
    let faulty = |fault| SimConfig {
        fault,
        ..config(SimRole::Unified)
    };
    let sim = start(faulty(SimFault::AbortNoStatus)).await;
    let (status, out) = post(sim.http_addr, "/v1/embeddings", &json!({"input": PROMPT})).await;
    assert_error(
        status,
        &out,
        500,
        "InternalServerError",
        "Internal server error: Request aborted",
    );
    sim.shutdown().await;

    let sim = start(faulty(SimFault::Reset)).await;
    let dropped = post_as(
        sim.http_addr,
        "/v1/embeddings",
        "application/json",
        &json!({"input": PROMPT}),
    )
    .await;
    assert!(dropped.is_none(), "{dropped:?}");
    // A bad body is answered by the HTTP layer before the engine is involved.
    let (status, _) = post(sim.http_addr, "/v1/embeddings", &json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sim.shutdown().await;

    // The incident: an input over the pool is answered from a one-token placeholder.
    let sim = start(faulty(SimFault::Incident)).await;
    let long: Vec<u32> = ids(" paged").iter().cycle().take(5000).copied().collect();
    let (status, out) = post(sim.http_addr, "/v1/embeddings", &json!({"input": long})).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn rerank_orders_documents_by_relevance() {
    let sim = start(config(SimRole::Unified)).await;
    let addr = sim.http_addr;
    let query = "paged attention KV cache";
    let documents = [
        "The recipe needs two eggs and flour.",
        "Paged attention keeps the KV cache in fixed-size pages.",
        "A cache of old books.",
    ];
    let (status, out) = post(
        addr,
        "/v1/rerank",
        &json!({"query": query, "documents": documents}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let list = out.as_array().unwrap();
    assert_eq!(list.len(), 3);
    assert_eq!(list[0]["index"], 1);
    assert_eq!(list[0]["document"], documents[1]);
    let scores: Vec<f64> = list.iter().map(|e| e["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{scores:?}");
    for entry in list {
        let i = entry["index"].as_u64().unwrap() as usize;
        let meta = &entry["meta_info"];
        assert_eq!(
            meta["prompt_tokens"],
            ids(query).len() + ids(documents[i]).len()
        );
        assert_eq!(
            meta["finish_reason"],
            json!({"type": "length", "length": 0})
        );
        assert!(meta["id"].is_string());
    }
    let body =
        json!({"query": query, "documents": documents, "top_n": 1, "return_documents": false});
    let (_, out) = post(addr, "/v1/rerank", &body).await;
    assert_eq!(out.as_array().unwrap().len(), 1);
    assert_eq!(out[0]["index"], 1);
    assert!(out[0].get("document").is_none(), "{out}");
    // SGLang serves rerank for PUT too, with content parts as text.
    let parts =
        json!([{"type": "text", "text": "paged attention"}, {"type": "text", "text": "KV cache"}]);
    let req = Request::builder()
        .method(Method::PUT)
        .uri(format!("http://{addr}/v1/rerank"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            json!({"query": parts, "documents": documents}).to_string(),
        )))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    for (bad, code, kind, text) in [
        (
            json!({"query": query, "documents": []}),
            400,
            "BadRequestError",
            "Documents cannot be empty",
        ),
        (
            json!({"query": " ", "documents": documents}),
            400,
            "BadRequestError",
            "Query cannot be empty or whitespace only",
        ),
        (
            json!({"query": query, "documents": ["a", ""]}),
            400,
            "BadRequestError",
            "Each document must be a non-empty string",
        ),
        (
            json!({"query": query, "documents": documents, "top_n": 0}),
            400,
            "Bad Request",
            "parameter top_n should be larger than 0",
        ),
        (
            json!({"documents": documents}),
            400,
            "Bad Request",
            "query: Field required",
        ),
    ] {
        let (status, out) = post(addr, "/v1/rerank", &bad).await;
        assert_error(status, &out, code, kind, text);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn score_gives_label_probabilities_per_item() {
    let sim = start(config(SimRole::Unified)).await;
    let addr = sim.http_addr;
    let yes = ids("yes")[0];
    let no = ids("no")[0];
    let query = "Is Paris the capital of France? Answer:";
    let items = [" yes", " no"];
    let body =
        json!({"query": query, "items": items, "label_token_ids": [yes, no], "model": MODEL});
    let (status, out) = post(addr, "/v1/score", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["object"], "scoring");
    assert_eq!(out["model"], MODEL);
    assert_eq!(out["pooled_hidden_states"], Value::Null);
    assert_eq!(out["token_logprobs"], Value::Null);
    let prompt: usize = items
        .iter()
        .map(|i| ids(&format!("{query}{i}")).len())
        .sum();
    assert_eq!(out["usage"]["prompt_tokens"], prompt);
    assert_eq!(out["usage"]["total_tokens"], prompt);
    let rows = out["scores"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        let row: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .collect();
        assert_eq!(row.len(), 2);
        assert!(row.iter().all(|p| *p > 0.0 && *p < 1.0), "{row:?}");
    }
    // Softmax over the labels, logprobs on request, the same scores every time.
    let mut soft = body.clone();
    soft["apply_softmax"] = json!(true);
    soft["temperature"] = json!(0.5);
    soft["return_token_logprobs"] = json!(true);
    let (_, again) = post(addr, "/v1/score", &soft).await;
    for row in again["scores"].as_array().unwrap() {
        let sum: f64 = row
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-9);
    }
    let logprob = again["token_logprobs"][0][0].as_f64().unwrap();
    assert!((logprob.exp() - out["scores"][0][0].as_f64().unwrap()).abs() < 1e-12);
    // Token ids: query then item, counted as given; item_first puts the item first.
    let q = ids(query);
    let body = json!({"query": q, "items": [[1, 2, 3]], "label_token_ids": [[yes, no]], "item_first": true});
    let (_, out) = post(addr, "/v1/score", &body).await;
    assert_eq!(out["usage"]["prompt_tokens"], q.len() + 3);
    assert_eq!(out["model"], "default");
    let (_, out) = post(
        addr,
        "/v1/score",
        &json!({"query": query, "items": [], "label_token_ids": [yes]}),
    )
    .await;
    assert_eq!(out["scores"], json!([]));
    assert_eq!(out["usage"]["prompt_tokens"], 0);
    for (bad, kind, text) in [
        (
            json!({"query": query, "items": items}),
            "BadRequestError",
            "label_token_ids is required for generation (CausalLM) models.",
        ),
        (
            json!({"query": query, "label_token_ids": [yes]}),
            "BadRequestError",
            "items must be provided",
        ),
        (
            json!({"query": query, "items": items, "label_token_ids": [yes, yes]}),
            "BadRequestError",
            "label_token_ids must not contain duplicate tokens",
        ),
        (
            json!({"query": query, "items": items, "label_token_ids": [[yes]]}),
            "BadRequestError",
            "label_token_ids must have one list per item",
        ),
        (
            json!({"query": query, "items": items, "label_token_ids": [999_999_999]}),
            "BadRequestError",
            "is out of vocabulary",
        ),
        (
            json!({"query": query, "items": items, "label_token_ids": [yes], "temperature": 2.0}),
            "BadRequestError",
            "temperature requires apply_softmax=True",
        ),
        (
            json!({"query": q, "items": items, "label_token_ids": [yes]}),
            "BadRequestError",
            "Invalid combination of query/items types for score_request.",
        ),
        (
            json!({"query": query, "items": items, "label_token_ids": [yes], "temperature": 0}),
            "Bad Request",
            "temperature",
        ),
    ] {
        let (status, out) = post(addr, "/v1/score", &bad).await;
        assert_error(status, &out, 400, kind, text);
    }
    sim.shutdown().await;
}

/// A Responses request about the weather, thinking off, with `extra` fields added.
fn responses(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "input": QUESTION, "reasoning": {"effort": "none"}});
    if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
        map.extend(extra);
    }
    body
}

/// The prompt ids of the chat a Responses request with `messages` becomes (thinking off).
fn responses_prompt(messages: Value) -> Vec<u32> {
    chat_prompt_ids(&json!({
        "messages": messages, "reasoning_effort": "none",
        "chat_template_kwargs": {"thinking": false, "enable_thinking": false},
    }))
}

/// `event: <type>` / `data: <json>` pairs of a Responses stream.
async fn post_events(addr: SocketAddr, body: &Value) -> (StatusCode, Vec<(String, Value)>) {
    let (status, bytes) = send(
        addr,
        Method::POST,
        "/v1/responses",
        Bytes::from(body.to_string()),
    )
    .await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (kind, data) = e.split_once('\n').unwrap();
            let kind = kind.strip_prefix("event: ").unwrap().to_string();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], kind);
            (kind, data)
        })
        .collect();
    (status, events)
}

#[tokio::test]
async fn responses_answer_count_store_and_continue() {
    let sim = start(store_config()).await;
    let addr = sim.http_addr;
    let instructions = "Answer briefly.";
    let body = responses(
        json!({"instructions": instructions, "max_output_tokens": 10, "metadata": {"k": "v"}}),
    );
    let (status, out) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let id = out["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("resp_"), "{id}");
    assert_eq!(out["object"], "response");
    assert_eq!(out["model"], MODEL);
    assert_eq!(out["instructions"], instructions);
    assert_eq!(out["metadata"], json!({"k": "v"}));
    assert_eq!(out["store"], true);
    assert_eq!(out["text"], json!({"format": {"type": "text"}}));
    let prompt = responses_prompt(json!([
        {"role": "system", "content": instructions},
        {"role": "user", "content": QUESTION},
    ]));
    // max_output_tokens leaves two tokens of headroom: 8 are generated, the budget's end.
    assert_eq!(out["status"], "incomplete", "{out}");
    assert_eq!(
        out["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(
        out["usage"],
        json!({"input_tokens": prompt.len(), "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
               "output_tokens": 8, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt.len() + 8})
    );
    let message = &out["output"][0];
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["status"], "completed");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    let answer = message["content"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(message["content"][0]["type"], "output_text");
    assert_eq!(answer, echo(&prompt, 8));

    let (status, stored) = get(addr, &format!("/v1/responses/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(stored, out);

    // The continuation's prompt is the stored conversation plus the new input.
    let follow = "And next week?";
    let body = responses(json!({"input": follow, "previous_response_id": id}));
    let (status, next) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    // `instructions` belong to their request only: the continuation has none.
    let prompt = responses_prompt(json!([
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": follow},
    ]));
    assert_eq!(next["usage"]["input_tokens"], prompt.len(), "{next}");
    assert_eq!(next["previous_response_id"], id);
    // Without a budget the whole context is the limit: the answer is the prompt's echo.
    assert_eq!(next["status"], "completed");
    assert_eq!(
        next["output"][0]["content"][0]["text"],
        echo(&prompt, prompt.len())
    );

    for (path, body, code, param, text) in [
        (
            "/v1/responses",
            responses(json!({"previous_response_id": "resp_nope"})),
            404,
            json!("response_id"),
            "Response with id 'resp_nope' not found.",
        ),
        (
            "/v1/responses",
            responses(json!({"previous_response_id": "abc"})),
            400,
            json!("response_id"),
            "Expected an ID that begins with 'resp'",
        ),
        (
            "/v1/responses",
            responses(json!({"model": "other"})),
            404,
            json!("model"),
            "The model 'other' does not exist",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL}),
            400,
            Value::Null,
            "input: Field required",
        ),
        (
            "/v1/responses",
            responses(json!({"tool_choice": "required"})),
            400,
            Value::Null,
            "requires at least one tool",
        ),
        (
            "/v1/responses",
            responses(json!({"background": true, "store": false})),
            400,
            json!("store"),
            "background=true requires store=true.",
        ),
        (
            "/v1/responses",
            responses(json!({"input": [{"type": "item_reference", "id": "x"}]})),
            400,
            Value::Null,
            "Unsupported Responses API input item type: 'item_reference'",
        ),
        (
            "/v1/responses/resp_nope/cancel",
            json!({}),
            404,
            json!("response_id"),
            "not found",
        ),
    ] {
        let (status, out) = post(addr, path, &body).await;
        assert_responses_error(status, &out, code, param, text);
    }
    let (status, out) = get(addr, "/v1/responses/resp_nope").await;
    assert_responses_error(status, &out, 404, json!("response_id"), "not found");
    let (status, _) = send(
        addr,
        Method::DELETE,
        &format!("/v1/responses/{id}"),
        Bytes::new(),
    )
    .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    sim.shutdown().await;

    // Without --enable-response-store nothing is kept, and asking for it is refused.
    let sim = start(config(SimRole::Unified)).await;
    let (_, out) = post(sim.http_addr, "/v1/responses", &responses(json!({}))).await;
    let id = out["id"].as_str().unwrap();
    let (status, out) = get(sim.http_addr, &format!("/v1/responses/{id}")).await;
    assert_responses_error(
        status,
        &out,
        400,
        json!("response_id"),
        "Response store is disabled",
    );
    let body = responses(json!({"previous_response_id": id}));
    let (status, out) = post(sim.http_addr, "/v1/responses", &body).await;
    assert_responses_error(
        status,
        &out,
        400,
        json!("previous_response_id"),
        "--enable-response-store",
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_streamed_response_sends_the_event_sequence() {
    let sim = start(store_config()).await;
    let body = responses(json!({"stream": true, "max_output_tokens": 12}));
    let (status, events) = post_events(sim.http_addr, &body).await;
    assert_eq!(status, StatusCode::OK);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    let deltas = kinds
        .iter()
        .filter(|k| **k == "response.output_text.delta")
        .count();
    assert!(deltas >= 5, "{kinds:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]);
    assert_eq!(kinds, expected);
    for (n, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], n);
    }
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let text: String = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let last = &events.last().unwrap().1["response"];
    assert_eq!(last["output"][0]["content"][0]["text"], text);
    let prompt = responses_prompt(json!([{"role": "user", "content": QUESTION}]));
    assert_eq!(text, echo(&prompt, 10));
    assert_eq!(last["usage"]["output_tokens"], 10);
    assert_eq!(last["usage"]["input_tokens"], prompt.len());
    // Kept once answered.
    let id = last["id"].as_str().unwrap();
    let (_, stored) = get(sim.http_addr, &format!("/v1/responses/{id}")).await;
    assert_eq!(&stored, last);
    // Logprobs are refused when streaming.
    let body = responses(json!({"stream": true, "include": ["message.output_text.logprobs"]}));
    let (status, out) = post(sim.http_addr, "/v1/responses", &body).await;
    assert_responses_error(
        status,
        &out,
        400,
        json!("logprobs"),
        "not supported in streaming mode",
    );
    sim.shutdown().await;
}

fn weather_tool() -> Value {
    json!([{"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]
    }}])
}

#[tokio::test]
async fn a_forced_tool_call_is_a_function_call_item_and_its_result_ends_the_loop() {
    let sim = start(store_config()).await;
    let addr = sim.http_addr;
    let body = responses(
        json!({"tools": weather_tool(), "tool_choice": "required", "max_output_tokens": 200}),
    );
    let (status, out) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let call = &out["output"][0];
    assert_eq!(call["type"], "function_call", "{out}");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let call_id = call["call_id"].as_str().unwrap().to_string();
    assert!(call_id.starts_with("call_"));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    assert_eq!(out["tool_choice"], "required");
    assert_eq!(out["tools"][0]["name"], "get_weather");
    assert_eq!(out["tools"][0]["strict"], false);
    assert_eq!(out["text"], Value::Null);

    // Streamed: the call's item, its argument deltas, their done events.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, events) = post_events(addr, &streamed).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[2], "response.output_item.added");
    assert_eq!(events[2].1["item"]["type"], "function_call");
    let args: String = events
        .iter()
        .filter(|(k, _)| k == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    let done = events
        .iter()
        .find(|(k, _)| k == "response.function_call_arguments.done")
        .unwrap();
    assert_eq!(done.1["arguments"], args);
    assert_eq!(done.1["name"], "get_weather");
    assert_eq!(kinds.last().unwrap(), &"response.completed");

    // The client ran the call: its output, continuing the stored response, is answered.
    let id = out["id"].as_str().unwrap();
    let result = json!([{"type": "function_call_output", "call_id": call_id, "output": "22 degrees and sunny"}]);
    let body =
        responses(json!({"tools": weather_tool(), "input": result, "previous_response_id": id}));
    let (status, out) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let text = out["output"][0]["content"][0]["text"].as_str().unwrap();
    assert!(text.contains("22 degrees and sunny"), "{out}");
    let (status, out) = post(
        addr,
        "/v1/responses",
        &responses(
            json!({"tools": weather_tool(), "tool_choice": {"type": "function", "name": "nope"}}),
        ),
    )
    .await;
    assert_responses_error(
        status,
        &out,
        400,
        json!("tool_choice"),
        "Tool 'nope' is not declared in tools",
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn responses_fail_inside_a_200_or_refuse_as_sglang_does() {
    let faulty = |fault| SimConfig {
        fault,
        ..config(SimRole::Unified)
    };
    // An abort without a status: a failed response inside a 200, plain and streamed.
    let sim = start(faulty(SimFault::AbortNoStatus)).await;
    let (status, out) = post(sim.http_addr, "/v1/responses", &responses(json!({}))).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["status"], "failed");
    assert_eq!(out["error"]["code"], "server_error");
    assert!(out["error"]["message"]
        .as_str()
        .unwrap()
        .contains("aborted"));
    let (status, events) = post_events(sim.http_addr, &responses(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "response.failed");
    assert_eq!(last["response"]["error"]["code"], "server_error");
    sim.shutdown().await;

    // Three tokens, then an abort: the partial text, then response.failed.
    let sim = start(faulty(SimFault::AbortMidStream)).await;
    let (_, events) = post_events(sim.http_addr, &responses(json!({"stream": true}))).await;
    let deltas = events
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .count();
    assert!(deltas >= 1, "{events:?}");
    assert_eq!(events.last().unwrap().0, "response.failed");
    assert_eq!(
        events.last().unwrap().1["response"]["output"][0]["type"],
        "message"
    );
    sim.shutdown().await;

    // An error mid-stream: response.failed right after the deltas, nothing closed.
    let sim = start(faulty(SimFault::ErrorEvent)).await;
    let (_, events) = post_events(sim.http_addr, &responses(json!({"stream": true}))).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.last().unwrap(), &"response.failed");
    assert_eq!(
        kinds[kinds.len() - 2],
        "response.output_text.delta",
        "{kinds:?}"
    );
    assert_eq!(events.last().unwrap().1["response"]["output"], json!([]));
    sim.shutdown().await;

    // A prompt over the pool: a 400 when plain, response.failed when streamed.
    let sim = start(config(SimRole::Unified)).await;
    let long = PROMPT.repeat(300);
    let (status, out) = post(
        sim.http_addr,
        "/v1/responses",
        &responses(json!({"input": long})),
    )
    .await;
    assert_responses_error(
        status,
        &out,
        400,
        Value::Null,
        "exceeds the maximum allowed length",
    );
    assert_eq!(out["error"]["type"], "invalid_request_error");
    let (status, events) = post_events(
        sim.http_addr,
        &responses(json!({"input": long, "stream": true})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "response.failed");
    assert!(last["response"]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("exceeds the maximum allowed length"));
    // The prompt of a response reached the engine as the client sent it.
    let received = sim.engine.received();
    assert!(received.iter().all(|r| r.path == "/v1/responses"));
    assert_eq!(received.last().unwrap().body["input"], long);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_background_response_is_queued_then_kept_or_cancelled() {
    let sim = start(SimConfig {
        token_latency: Duration::from_millis(20),
        ..store_config()
    })
    .await;
    let addr = sim.http_addr;
    let body = responses(json!({"background": true, "max_output_tokens": 6}));
    let (status, out) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["status"], "queued");
    assert_eq!(out["usage"], Value::Null);
    let id = out["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let (_, stored) = get(addr, &path).await;
        if stored["status"] == "incomplete" || stored["status"] == "completed" {
            break stored;
        }
        assert!(tokio::time::Instant::now() < deadline, "{stored}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done["usage"]["output_tokens"], 4);
    // A finished response is returned as it is by cancel.
    let (_, same) = post(addr, &format!("{path}/cancel"), &json!({})).await;
    assert_eq!(same["status"], done["status"]);

    // A long one is cancelled while it runs: its pages are freed and it stays cancelled.
    let body = responses(json!({"background": true, "max_output_tokens": 200}));
    let (_, out) = post(addr, "/v1/responses", &body).await;
    let path = format!("/v1/responses/{}", out["id"].as_str().unwrap());
    let (status, cancelled) = post(addr, &format!("{path}/cancel"), &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let (_, stored) = get(addr, &path).await;
    assert_eq!(stored["status"], "cancelled");
    sim.engine
        .wait_for_stats(Duration::from_secs(5), |s| s.running_reqs == 0)
        .await
        .unwrap();
    sim.shutdown().await;
}

#[tokio::test]
async fn a_reasoning_parser_adds_a_reasoning_item_and_text_format_answers_json() {
    let sim = start(SimConfig {
        reasoning_parser: Some(kvgate_sim::ReasoningParser::Qwen3),
        ..config(SimRole::Unified)
    })
    .await;
    let addr = sim.http_addr;
    // Thinking on (Qwen3's default): the thought is a reasoning item before the message.
    let body =
        json!({"input": QUESTION, "max_output_tokens": 60, "reasoning": {"summary": "auto"}});
    let (status, out) = post(addr, "/v1/responses", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let reasoning = &out["output"][0];
    assert_eq!(reasoning["type"], "reasoning", "{out}");
    assert!(reasoning["id"].as_str().unwrap().starts_with("rs_"));
    let thought = reasoning["content"][0]["text"].as_str().unwrap();
    assert!(!thought.is_empty());
    assert_eq!(reasoning["content"][0]["type"], "reasoning_text");
    assert_eq!(
        reasoning["summary"],
        json!([{"type": "summary_text", "text": thought}])
    );
    assert_eq!(out["output"][1]["type"], "message");
    assert_eq!(
        out["reasoning"],
        json!({"effort": "medium", "summary": null})
    );
    // Streamed: the reasoning item's summary events, then the message's.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, events) = post_events(addr, &streamed).await;
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds[2], "response.output_item.added");
    assert_eq!(kinds[3], "response.reasoning_summary_part.added");
    let summary: String = events
        .iter()
        .filter(|(k, _)| k == "response.reasoning_summary_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(summary, thought);
    let at = |kind: &str| kinds.iter().position(|k| *k == kind).unwrap();
    assert!(at("response.reasoning_summary_text.done") < at("response.output_text.delta"));
    assert_eq!(
        events.last().unwrap().1["response"]["output"][0]["type"],
        "reasoning"
    );

    // `text.format` constrains the answer to a JSON document, echoed in `text`.
    let schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let format = json!({"format": {"type": "json_schema", "name": "place", "schema": schema}});
    let body = json!({"input": QUESTION, "text": format, "reasoning": {"effort": "none"}, "max_output_tokens": 100});
    let (_, out) = post(addr, "/v1/responses", &body).await;
    let text = out["output"][0]["content"][0]["text"].as_str().unwrap();
    let document: Value = serde_json::from_str(text).unwrap();
    assert!(document["city"].is_string(), "{document}");
    assert_eq!(out["text"], format);
    sim.shutdown().await;
}
