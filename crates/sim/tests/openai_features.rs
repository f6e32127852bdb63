//! What a newcomer tries with the OpenAI SDK, over real HTTP to an in-process sim: `n`,
//! `stop` and logprobs on `/v1/chat/completions` and `/v1/completions`, plain and streamed,
//! in SGLang's shapes, with usage counting exactly the tokens each answer represents.

mod support;

use serde_json::{json, Value};
use support::*;

/// A chat body asking about [`PROMPT`], thinking off (so the answer is the plain echo),
/// with `extra` fields added.
fn chat(max_tokens: usize, extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": PROMPT}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
        map.extend(extra);
    }
    body
}

/// The token ids of [`chat`]'s prompt.
fn chat_ids() -> Vec<u32> {
    chat_prompt_ids(&chat(1, json!({})))
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

/// The data events before `[DONE]` (which must end the stream).
fn data(events: &[Value]) -> &[Value] {
    assert_eq!(events.last().unwrap(), "[DONE]", "{events:?}");
    &events[..events.len() - 1]
}

/// The chunks of choice `index`.
fn of_choice(events: &[Value], index: usize) -> Vec<&Value> {
    data(events)
        .iter()
        .filter_map(|e| e["choices"].as_array())
        .flatten()
        .filter(|c| c["index"] == index)
        .collect()
}

/// Choice `index`'s streamed text: chat deltas' `key`, or completions' `text`.
fn joined(events: &[Value], index: usize, key: &str) -> String {
    of_choice(events, index)
        .iter()
        .filter_map(|c| c["delta"][key].as_str().or_else(|| c["text"].as_str()))
        .collect()
}

/// Choice `index`'s final chunk.
fn finish_of(events: &[Value], index: usize) -> &Value {
    of_choice(events, index)
        .into_iter()
        .find(|c| !c["finish_reason"].is_null())
        .expect("a finish chunk")
}

#[tokio::test]
async fn n_gives_n_choices_counted_once_per_prompt_plain_and_streamed() {
    let sim = start(config(SimRole::Unified)).await;
    let ids = chat_ids();
    let (status, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(5, json!({"n": 3})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let choices = out["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], echo(&ids, 5));
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": ids.len(), "completion_tokens": 15, "total_tokens": ids.len() + 15, "prompt_tokens_details": null})
    );

    let (status, events) = post_sse(
        sim.http_addr,
        "/v1/chat/completions",
        &streamed(chat(5, json!({"n": 3}))),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for i in 0..3 {
        assert_eq!(of_choice(&events, i)[0]["delta"]["role"], "assistant");
        assert_eq!(joined(&events, i, "content"), echo(&ids, 5));
        assert_eq!(finish_of(&events, i)["finish_reason"], "length");
    }
    let usage = &data(&events).last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], ids.len());
    assert_eq!(usage["completion_tokens"], 15);

    // Completions: two prompts, two choices each, indexed prompt by prompt.
    let body = json!({"prompt": ["a b c d", "e f g h"], "n": 2, "max_tokens": 2});
    let (status, out) = post(sim.http_addr, "/v1/completions", &body).await;
    assert_eq!(status, StatusCode::OK);
    let texts: Vec<&str> = out["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    let first = echo(&QWEN3.encode("a b c d", true).unwrap(), 2);
    let second = echo(&QWEN3.encode("e f g h", true).unwrap(), 2);
    assert_eq!(texts, [first.as_str(), &first, &second, &second]);
    let prompts =
        QWEN3.encode("a b c d", true).unwrap().len() + QWEN3.encode("e f g h", true).unwrap().len();
    assert_eq!(out["usage"]["prompt_tokens"], prompts);
    assert_eq!(out["usage"]["completion_tokens"], 8);
    let (_, events) = post_sse(sim.http_addr, "/v1/completions", &streamed(body)).await;
    for (i, text) in [&first, &first, &second, &second].into_iter().enumerate() {
        assert_eq!(&joined(&events, i, "text"), text);
    }
    assert_eq!(
        data(&events).last().unwrap()["usage"]["completion_tokens"],
        8
    );

    let (status, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(5, json!({"n": 0})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["object"], "error");
    assert_eq!(out["code"], 400);
    sim.shutdown().await;
}

/// The first `k` for which the text of `ids[..k]` holds `stop`, and that text cut before it.
fn stopped_at(ids: &[u32], stop: &str) -> (usize, String) {
    (1..=ids.len())
        .find_map(|k| {
            let text = QWEN3.decode(&ids[..k], true).unwrap();
            text.find(stop).map(|at| (k, text[..at].to_string()))
        })
        .expect("the stop string is in the answer")
}

#[tokio::test]
async fn a_stop_string_in_the_answer_cuts_it_there_plain_and_streamed() {
    let sim = start(config(SimRole::Unified)).await;
    let ids = chat_ids();
    let answer = &ids[ids.len() - 16..];
    assert!(echo(&ids, 16).contains("memory") && echo(&ids, 16).contains("wasted"));
    let (tokens, text) = stopped_at(answer, "memory");
    // The stop string found first in the text wins, whatever its place in the list.
    let body = chat(16, json!({"stop": ["wasted", "memory"]}));
    let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let choice = &out["choices"][0];
    assert_eq!(choice["message"]["content"], text);
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["matched_stop"], "memory");
    assert_eq!(out["usage"]["completion_tokens"], tokens);

    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &streamed(body)).await;
    assert_eq!(joined(&events, 0, "content"), text);
    let finish = finish_of(&events, 0);
    assert_eq!(finish["finish_reason"], "stop");
    assert_eq!(finish["matched_stop"], "memory");
    assert_eq!(
        data(&events).last().unwrap()["usage"]["completion_tokens"],
        tokens
    );

    // A stop string the answer does not hold: it runs to max_tokens.
    let (_, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(16, json!({"stop": "zebra"})),
    )
    .await;
    assert_eq!(out["choices"][0]["message"]["content"], echo(&ids, 16));
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    assert_eq!(out["choices"][0]["matched_stop"], Value::Null);
    assert_eq!(out["usage"]["completion_tokens"], 16);

    // Completions, and a stop that is already in the first token's text.
    let prompt_ids = QWEN3.encode(PROMPT, true).unwrap();
    let answer = &prompt_ids[prompt_ids.len() - 8..];
    let (tokens, text) = stopped_at(answer, " so");
    let body = json!({"prompt": PROMPT, "max_tokens": 8, "stop": " so"});
    let (_, out) = post(sim.http_addr, "/v1/completions", &body).await;
    assert_eq!(out["choices"][0]["text"], text);
    assert_eq!(out["choices"][0]["matched_stop"], " so");
    assert_eq!(out["usage"]["completion_tokens"], tokens);
    let (_, events) = post_sse(sim.http_addr, "/v1/completions", &streamed(body)).await;
    assert_eq!(joined(&events, 0, "text"), text);
    assert_eq!(finish_of(&events, 0)["matched_stop"], " so");

    let (status, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(4, json!({"stop": 7})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["type"], "BadRequestError");
    sim.shutdown().await;
}

/// Checks one chat logprobs entry and returns its token.
fn check_chat_entry(entry: &Value, k: usize) -> String {
    let token = entry["token"].as_str().unwrap();
    let logprob = entry["logprob"].as_f64().unwrap();
    assert!(logprob <= 0.0, "{entry}");
    assert_eq!(entry["bytes"], json!(token.as_bytes()));
    let top = entry["top_logprobs"].as_array().unwrap();
    assert_eq!(top.len(), k, "{entry}");
    assert_eq!(top[0]["token"], token, "the chosen token is the likeliest");
    assert_eq!(top[0]["logprob"].as_f64().unwrap(), logprob);
    for pair in top.windows(2) {
        assert!(pair[0]["logprob"].as_f64().unwrap() > pair[1]["logprob"].as_f64().unwrap());
    }
    for t in top {
        assert_eq!(t["bytes"], json!(t["token"].as_str().unwrap().as_bytes()));
    }
    token.to_string()
}

#[tokio::test]
async fn logprobs_come_per_token_in_sglangs_shapes_plain_and_streamed() {
    let sim = start(config(SimRole::Unified)).await;
    let ids = chat_ids();
    let body = chat(6, json!({"logprobs": true, "top_logprobs": 3}));
    let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let content = out["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 6);
    assert_eq!(out["usage"]["completion_tokens"], 6);
    let tokens: Vec<String> = content.iter().map(|e| check_chat_entry(e, 3)).collect();
    let expected: Vec<String> = ids[ids.len() - 6..]
        .iter()
        .map(|&id| QWEN3.decode(&[id], false).unwrap())
        .collect();
    assert_eq!(tokens, expected);

    // Streamed: each chunk carries the logprobs of the tokens it adds; together, the same.
    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &streamed(body)).await;
    let per_chunk: Vec<Value> = of_choice(&events, 0)
        .iter()
        .filter_map(|c| c["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&per_chunk, content, "deterministic, and the same per token");
    // Without logprobs: null.
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &chat(2, json!({}))).await;
    assert_eq!(out["choices"][0]["logprobs"], Value::Null);
    let (_, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(2, json!({"logprobs": true})),
    )
    .await;
    assert_eq!(
        out["choices"][0]["logprobs"]["content"][0]["top_logprobs"],
        json!([])
    );

    // Completions: `logprobs: k` gives tokens, token_logprobs, top_logprobs and offsets.
    let body = json!({"prompt": PROMPT, "max_tokens": 5, "logprobs": 2});
    let (_, out) = post(sim.http_addr, "/v1/completions", &body).await;
    let lp = &out["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let mut at = 0;
    for (i, token) in tokens.iter().enumerate() {
        let token = token.as_str().unwrap();
        assert_eq!(offsets[i], at);
        at += token.chars().count() as u64;
        let logprob = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(logprob <= 0.0);
        let top = lp["top_logprobs"][i].as_object().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[token].as_f64().unwrap(), logprob);
        assert!(top.values().all(|v| v.as_f64().unwrap() <= logprob));
    }
    assert_eq!(
        tokens
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect::<String>(),
        out["choices"][0]["text"]
    );
    let (_, events) = post_sse(sim.http_addr, "/v1/completions", &streamed(body)).await;
    let per_chunk: Vec<Value> = of_choice(&events, 0)
        .iter()
        .filter_map(|c| c["logprobs"]["tokens"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&per_chunk, tokens);

    let (status, _) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(2, json!({"logprobs": true, "top_logprobs": 50})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sim.shutdown().await;
}
