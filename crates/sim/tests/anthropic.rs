//! Anthropic's `POST /v1/messages` on the simulated engine, over real HTTP, as SGLang's
//! `anthropic/serving.py` serves it: plain and streamed answers, a tool-use round trip,
//! aborts (invisible: `end_turn`), errors mid-stream, refused prompts and refused
//! conversions.

mod support;

use kvgate_tokenize::prepare::anthropic::sglang_messages_chat;
use serde_json::{json, Value};
use support::*;

const QUESTION: &str = "What is the weather like in Paris this week?";

fn messages(extra: Value) -> Value {
    let mut body = json!({
        "model": "claude-sonnet-4-5", "max_tokens": 40,
        "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": QUESTION}],
    });
    if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
        map.extend(extra);
    }
    body
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The weather in a city.", "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
    }})
}

/// The prompt tokens SGLang counts for this Anthropic body: its chat, prepared by the rules.
fn prompt_tokens(body: &Value) -> usize {
    let chat = sglang_messages_chat(body.as_object().unwrap()).unwrap();
    chat_prompt_ids(&Value::Object(chat)).len()
}

/// Anthropic SSE: `(event, data)` pairs; each event's name is its data's `type`.
async fn post_events(addr: SocketAddr, body: &Value) -> (StatusCode, Vec<Value>) {
    let (status, bytes) = send(
        addr,
        Method::POST,
        "/v1/messages",
        Bytes::from(body.to_string()),
    )
    .await;
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let events = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (head, data) = e.split_once('\n').expect("an event line and a data line");
            let name = head.strip_prefix("event: ").expect("event line");
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name, "{e}");
            data
        })
        .collect();
    (status, events)
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The text of the `text_delta`s (or `partial_json` of `input_json_delta`s).
fn joined(events: &[Value], field: &str) -> String {
    events
        .iter()
        .filter_map(|e| e["delta"][field].as_str())
        .collect()
}

#[tokio::test]
async fn plain_message_counts_the_prompt_as_the_chat_does() {
    let sim = start(config(SimRole::Unified)).await;
    let body = messages(json!({}));
    let (status, out) = post(sim.http_addr, "/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert!(out["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(out["type"], "message");
    assert_eq!(out["role"], "assistant");
    assert_eq!(out["model"], "claude-sonnet-4-5");
    assert!(out.get("stop_sequence").is_none(), "exclude_none drops it");
    assert_eq!(out["content"][0]["type"], "text");
    assert!(!out["content"][0]["text"].as_str().unwrap().is_empty());
    assert!(["end_turn", "max_tokens"].contains(&out["stop_reason"].as_str().unwrap()));
    assert_eq!(out["usage"]["input_tokens"], prompt_tokens(&body));
    assert!(out["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert!(out["usage"].get("cache_read_input_tokens").is_none());
    sim.shutdown().await;
}

#[tokio::test]
async fn cached_prompt_tokens_are_reported_apart_with_cache_report() {
    let mut cfg = config(SimRole::Unified);
    cfg.enable_cache_report = true;
    let sim = start(cfg).await;
    let long = PROMPT.repeat(12);
    let body = messages(json!({"messages": [{"role": "user", "content": long}]}));
    let prompt = prompt_tokens(&body);
    let (_, first) = post(sim.http_addr, "/v1/messages", &body).await;
    assert_eq!(first["usage"]["input_tokens"], prompt);
    let (_, again) = post(sim.http_addr, "/v1/messages", &body).await;
    let cached = again["usage"]["cache_read_input_tokens"].as_u64().unwrap() as usize;
    assert!(cached > 0, "{again}");
    assert_eq!(again["usage"]["input_tokens"], prompt - cached);
    sim.shutdown().await;
}

#[tokio::test]
async fn streamed_message_is_the_anthropic_event_sequence() {
    let sim = start(config(SimRole::Unified)).await;
    let body = messages(json!({}));
    let (_, plain) = post(sim.http_addr, "/v1/messages", &body).await;
    let (status, events) = post_events(sim.http_addr, &messages(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let kinds = types(&events);
    assert_eq!(kinds[0], "message_start");
    assert_eq!(kinds[1], "content_block_start");
    assert_eq!(
        &kinds[kinds.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert!(!kinds.contains(&"ping"));
    let start = &events[0]["message"];
    assert_eq!(start["model"], "claude-sonnet-4-5");
    assert_eq!(start["content"], json!([]));
    assert_eq!(
        start["usage"],
        json!({"input_tokens": prompt_tokens(&body), "output_tokens": 0})
    );
    assert_eq!(
        events[1]["content_block"],
        json!({"type": "text", "text": ""})
    );
    assert_eq!(
        joined(&events, "text"),
        plain["content"][0]["text"].as_str().unwrap()
    );
    let delta = &events[events.len() - 2];
    assert_eq!(delta["delta"], json!({"stop_reason": plain["stop_reason"]}));
    assert_eq!(
        delta["usage"],
        json!({"output_tokens": plain["usage"]["output_tokens"]})
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn tool_use_round_trip() {
    let sim = start(config(SimRole::Unified)).await;
    let tools =
        json!({"tools": [weather_tool()], "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (status, out) = post(sim.http_addr, "/v1/messages", &messages(tools.clone())).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["stop_reason"], "tool_use");
    let call = out["content"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(call["type"], "tool_use");
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].is_string(), "{call}");

    // Streamed: one tool_use block whose JSON deltas make the same kind of input.
    let mut streamed = messages(tools.clone());
    streamed["stream"] = json!(true);
    let (_, events) = post_events(sim.http_addr, &streamed).await;
    let start = events
        .iter()
        .find(|e| e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use")
        .unwrap();
    assert_eq!(start["content_block"]["input"], json!({}));
    let input: Value = serde_json::from_str(&joined(&events, "partial_json")).unwrap();
    assert!(input["city"].is_string());
    assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use");

    // The result goes back; the conversation goes on and is counted as SGLang counts it.
    let follow = messages(json!({"tools": [weather_tool()], "messages": [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": out["content"].as_array().unwrap().last().unwrap()["id"], "content": "Sunny, 24°C all week."},
            {"type": "text", "text": "Thanks, summarize."},
        ]},
    ]}));
    let (status, answer) = post(sim.http_addr, "/v1/messages", &follow).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["input_tokens"], prompt_tokens(&follow));
    assert_ne!(answer["stop_reason"], "tool_use");
    sim.shutdown().await;
}

#[tokio::test]
async fn an_abort_without_status_is_an_ordinary_end_turn() {
    for fault in [SimFault::AbortNoStatus, SimFault::AbortMidStream] {
        let mut cfg = config(SimRole::Unified);
        cfg.fault = fault;
        let sim = start(cfg).await;
        let (status, out) = post(sim.http_addr, "/v1/messages", &messages(json!({}))).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        assert_eq!(out["stop_reason"], "end_turn", "{fault:?}");
        let (status, events) = post_events(sim.http_addr, &messages(json!({"stream": true}))).await;
        assert_eq!(status, StatusCode::OK);
        let kinds = types(&events);
        assert!(!kinds.contains(&"error"), "{fault:?}");
        assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "end_turn");
        assert_eq!(kinds.last(), Some(&"message_stop"));
        sim.shutdown().await;
    }
}

#[tokio::test]
async fn an_error_mid_stream_is_an_error_event_then_message_stop() {
    let mut cfg = config(SimRole::Unified);
    cfg.fault = SimFault::ErrorEvent;
    let sim = start(cfg).await;
    let (status, events) = post_events(sim.http_addr, &messages(json!({"stream": true}))).await;
    assert_eq!(status, StatusCode::OK);
    let kinds = types(&events);
    assert_eq!(kinds[0], "message_start");
    assert!(kinds.contains(&"content_block_delta"));
    assert_eq!(
        &kinds[kinds.len() - 3..],
        ["content_block_stop", "error", "message_stop"]
    );
    assert!(!kinds.contains(&"message_delta"));
    assert_eq!(events[events.len() - 2]["error"]["type"], "api_error");
    let (status, out) = post(sim.http_addr, "/v1/messages", &messages(json!({}))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        out,
        json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}})
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_refused_prompt_is_a_400_or_an_error_event() {
    let mut cfg = config(SimRole::Unified);
    cfg.context_length = 64;
    let sim = start(cfg).await;
    let long = messages(json!({"messages": [{"role": "user", "content": PROMPT.repeat(8)}]}));
    let (status, out) = post(sim.http_addr, "/v1/messages", &long).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
    assert_eq!(out["type"], "error");
    assert_eq!(out["error"]["type"], "BadRequestError");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("context length"),
        "{out}"
    );
    let mut streamed = long.clone();
    streamed["stream"] = json!(true);
    let (status, events) = post_events(sim.http_addr, &streamed).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(types(&events), ["message_start", "error", "message_stop"]);
    assert_eq!(
        events[0]["message"]["usage"],
        json!({"input_tokens": 0, "output_tokens": 0})
    );
    assert_eq!(events[1]["error"]["type"], "invalid_request_error");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_refused_conversion_is_a_400_before_any_work() {
    let sim = start(config(SimRole::Unified)).await;
    for (extra, path) in [
        (
            json!({"thinking": {"type": "enabled", "budget_tokens": 1024}}),
            "thinking",
        ),
        (
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role",
        ),
        (json!({"max_tokens": 0}), "max_tokens"),
    ] {
        let (status, out) = post(sim.http_addr, "/v1/messages", &messages(extra)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{out}");
        assert_eq!(out["type"], "error");
        assert_eq!(out["error"]["type"], "invalid_request_error");
        let message = out["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(&format!("{path}: ")), "{message}");
    }
    let (status, _) = get(sim.http_addr, "/v1/messages").await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    sim.shutdown().await;
}

#[tokio::test]
async fn with_a_reasoning_parser_the_thought_is_a_thinking_block() {
    let mut cfg = config(SimRole::Unified);
    cfg.reasoning_parser = Some(kvgate_sim::ReasoningParser::Qwen3);
    let sim = start(cfg).await;
    let body = messages(json!({"max_tokens": 60}));
    let (status, out) = post(sim.http_addr, "/v1/messages", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let thought = &out["content"][0];
    assert_eq!(thought["type"], "thinking", "{out}");
    assert!(
        thought.get("signature").is_none(),
        "newer SGLang omits an unknown signature"
    );
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (_, events) = post_events(sim.http_addr, &streamed).await;
    assert_eq!(
        events[1]["content_block"],
        json!({"type": "thinking", "thinking": ""})
    );
    assert_eq!(
        joined(&events, "thinking"),
        thought["thinking"].as_str().unwrap()
    );
    if let Some(text) = out["content"][1]["text"].as_str() {
        // The text block follows the thinking block at the next index.
        let start = events
            .iter()
            .find(|e| e["type"] == "content_block_start" && e["content_block"]["type"] == "text")
            .unwrap();
        assert_eq!(start["index"], 1);
        assert_eq!(joined(&events, "text"), text);
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn count_tokens_counts_the_chat_sglang_builds() {
    let sim = start(config(SimRole::Unified)).await;
    let body = messages(json!({"tools": [weather_tool()]}));
    let mut count = body.clone();
    count.as_object_mut().unwrap().remove("max_tokens");
    let (status, out) = post(sim.http_addr, "/v1/messages/count_tokens", &count).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out, json!({"input_tokens": prompt_tokens(&body)}));
    let (_, answered) = post(sim.http_addr, "/v1/messages", &body).await;
    assert_eq!(answered["usage"]["input_tokens"], out["input_tokens"]);
    count["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let (status, out) = post(sim.http_addr, "/v1/messages/count_tokens", &count).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(out["error"]["type"], "invalid_request_error");
    sim.shutdown().await;
}
