//! Tool calls, JSON answers and thinking on `/v1/chat/completions`, over real HTTP to an
//! in-process sim, plain and streamed, in SGLang's shapes; usage counts the tokens of what
//! is emitted.

mod support;

use serde_json::{json, Value};
use support::*;

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_time", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "detailed": {"type": "boolean"}
            },
            "required": ["city", "days", "unit"]
        }}}
    ])
}

const QUESTION: &str = "What is the weather like in Paris this week?";

/// A chat body about the weather, thinking off, with `extra` fields added.
fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL, "max_tokens": 100,
        "messages": [{"role": "user", "content": QUESTION}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    if let (Some(map), Value::Object(extra)) = (body.as_object_mut(), extra) {
        map.extend(extra);
    }
    body
}

fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

/// The chunks' deltas of choice 0, `[DONE]` checked and left out.
fn deltas(events: &[Value]) -> Vec<&Value> {
    assert_eq!(events.last().unwrap(), "[DONE]");
    events[..events.len() - 1]
        .iter()
        .filter_map(|e| e["choices"].as_array())
        .flatten()
        .map(|c| &c["delta"])
        .collect()
}

fn joined(events: &[Value], key: &str) -> String {
    deltas(events)
        .iter()
        .filter_map(|d| d[key].as_str())
        .collect()
}

fn finish_reason(events: &[Value]) -> Value {
    events
        .iter()
        .filter_map(|e| e["choices"].as_array())
        .flatten()
        .find(|c| !c["finish_reason"].is_null())
        .map(|c| c["finish_reason"].clone())
        .unwrap_or(Value::Null)
}

fn completion_tokens(events: &[Value]) -> u64 {
    events[events.len() - 2]["usage"]["completion_tokens"]
        .as_u64()
        .unwrap()
}

fn check_weather_arguments(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).unwrap();
    assert!(args["city"].is_string(), "{args}");
    let days = args["days"].as_i64().unwrap();
    assert!((1..=7).contains(&days));
    assert_eq!(args["unit"], "celsius", "an enum's first value");
    assert!(
        args.get("detailed").is_none(),
        "optional properties are left out"
    );
}

#[tokio::test]
async fn a_forced_tool_call_is_answered_as_tool_calls_plain_and_streamed() {
    let sim = start(config(SimRole::Unified)).await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    for (choice, required) in [(json!("required"), true), (named, false)] {
        let body = chat(json!({"tools": tools(), "tool_choice": choice}));
        let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        let c = &out["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls");
        assert_eq!(c["matched_stop"], Value::Null);
        assert_eq!(c["message"]["content"], Value::Null);
        let call = &c["message"]["tool_calls"][0];
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["type"], "function");
        assert_eq!(
            call["function"]["name"], "get_weather",
            "picked by the question"
        );
        let arguments = call["function"]["arguments"].as_str().unwrap();
        check_weather_arguments(arguments);
        // What the constrained engine generated, counted with the tokenizer.
        let raw = if required {
            format!("[{{\"name\": \"get_weather\", \"parameters\": {arguments}}}]")
        } else {
            arguments.to_string()
        };
        assert_eq!(
            out["usage"]["completion_tokens"],
            QWEN3.encode(&raw, false).unwrap().len()
        );

        let (status, events) =
            post_sse(sim.http_addr, "/v1/chat/completions", &streamed(body)).await;
        assert_eq!(status, StatusCode::OK);
        let calls: Vec<&Value> = deltas(&events)
            .into_iter()
            .filter_map(|d| d["tool_calls"].get(0))
            .collect();
        let head = calls[0];
        assert!(head["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(head["type"], "function");
        assert_eq!(head["index"], 0);
        assert_eq!(
            head["function"],
            json!({"name": "get_weather", "arguments": ""})
        );
        assert!(calls.len() > 2, "arguments come in fragments");
        let arguments: String = calls[1..]
            .iter()
            .map(|c| {
                assert!(c.get("id").is_none() && c["function"].get("name").is_none());
                c["function"]["arguments"].as_str().unwrap()
            })
            .collect();
        check_weather_arguments(&arguments);
        assert_eq!(finish_reason(&events), "tool_calls");
        assert_eq!(
            arguments, call["function"]["arguments"],
            "the same arguments"
        );
        assert_eq!(
            completion_tokens(&events),
            QWEN3.encode(&raw, false).unwrap().len() as u64
        );
    }
    // n choices each get a call of their own.
    let body = chat(json!({"tools": tools(), "tool_choice": "required", "n": 2}));
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    let id = |i: usize| out["choices"][i]["message"]["tool_calls"][0]["id"].clone();
    assert_ne!(id(0), id(1));

    // SGLang's checks, in its error shape.
    for (body, message) in [
        (
            chat(json!({"tool_choice": "required"})),
            "Tools cannot be empty if tool choice is set to required.",
        ),
        (
            chat(
                json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            ),
            "Tool 'nope' not found in tools list.",
        ),
    ] {
        let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            out,
            json!({"object": "error", "message": message, "type": "BadRequestError", "param": null, "code": 400})
        );
    }
    sim.shutdown().await;
}

#[tokio::test]
async fn auto_answers_text_and_a_tool_result_ends_the_loop() {
    let sim = start(config(SimRole::Unified)).await;
    let (_, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(json!({"tools": tools()})),
    )
    .await;
    let c = &out["choices"][0];
    assert!(
        c["message"]["content"].as_str().unwrap().contains("Paris"),
        "{out}"
    );
    assert_eq!(c["message"]["tool_calls"], Value::Null);
    assert_ne!(c["finish_reason"], "tool_calls");

    // The client ran the call and sends its result back: a text answer that mentions it.
    let messages = json!([
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1, \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees and sunny"}
    ]);
    let body = chat(json!({"tools": tools(), "messages": messages}));
    let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let content = out["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("22 degrees and sunny"), "{content}");
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        out["usage"]["completion_tokens"],
        QWEN3.encode(content, false).unwrap().len()
    );
    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &streamed(body)).await;
    assert_eq!(joined(&events, "content"), content);
    assert_eq!(finish_reason(&events), "stop");
    sim.shutdown().await;
}

#[tokio::test]
async fn response_format_answers_a_json_document_plain_and_streamed() {
    let sim = start(config(SimRole::Unified)).await;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 18},
            "tags": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        },
        "required": ["name", "age", "tags", "address"]
    });
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema}});
    let body = chat(json!({"response_format": format}));
    let (status, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let content = out["choices"][0]["message"]["content"].as_str().unwrap();
    let doc: Value = serde_json::from_str(content).unwrap();
    assert!(
        doc["name"].is_string() && doc["age"].as_i64().unwrap() >= 18,
        "{doc}"
    );
    assert!(doc["tags"].as_array().unwrap()[0].is_string());
    assert!(doc["address"]["city"].is_string());
    assert_eq!(out["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        out["usage"]["completion_tokens"],
        QWEN3.encode(content, false).unwrap().len()
    );
    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &streamed(body)).await;
    assert_eq!(joined(&events, "content"), content);
    assert_eq!(
        completion_tokens(&events),
        QWEN3.encode(content, false).unwrap().len() as u64
    );

    let (_, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_object"}})),
    )
    .await;
    let doc: Value =
        serde_json::from_str(out["choices"][0]["message"]["content"].as_str().unwrap()).unwrap();
    assert!(doc.is_object() && !doc.as_object().unwrap().is_empty());
    // Too few tokens for the document: cut, as an engine cuts it.
    let (_, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(json!({"response_format": format, "max_tokens": 3})),
    )
    .await;
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    assert_eq!(out["usage"]["completion_tokens"], 3);
    let (status, _) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sim.shutdown().await;
}

/// Ids of a one-message chat prompt about [`PROMPT`].
fn prompt_ids() -> Vec<u32> {
    let messages = json!([{"role": "user", "content": PROMPT}]);
    QWEN3
        .encode(
            &QWEN3.apply_chat_template(&messages, None, true).unwrap(),
            false,
        )
        .unwrap()
}

#[tokio::test]
async fn thinking_is_on_by_default_for_qwen3_inline_without_a_reasoning_parser() {
    let sim = start(config(SimRole::Unified)).await;
    let ids = prompt_ids();
    let body = json!({"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": PROMPT}]});
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    let c = &out["choices"][0];
    let content = c["message"]["content"].as_str().unwrap();
    assert!(content.starts_with("<think>\n"), "{content}");
    assert_eq!(c["message"]["reasoning_content"], Value::Null);
    let (thought, rest) = content.split_once("</think>\n\n").unwrap();
    // The thought's tokens and the end of the generated ids fill max_tokens.
    let thought_tokens = QWEN3
        .encode(&format!("{thought}</think>\n\n"), false)
        .unwrap()
        .len();
    assert_eq!(rest, echo(&ids, 20 - thought_tokens));
    assert_eq!(out["usage"]["completion_tokens"], 20);
    assert_eq!(c["finish_reason"], "length");
    let (_, events) = post_sse(
        sim.http_addr,
        "/v1/chat/completions",
        &streamed(body.clone()),
    )
    .await;
    assert_eq!(joined(&events, "content"), content);
    assert_eq!(completion_tokens(&events), 20);

    // Turned off, no thought.
    let mut off = body;
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &off).await;
    // Off, the template ends the prompt with an empty thought, which the answer echoes.
    assert_eq!(
        out["choices"][0]["message"]["content"],
        echo(&chat_prompt_ids(&off), 20)
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_reasoning_parser_separates_the_thought_plain_and_streamed() {
    let mut cfg = config(SimRole::Unified);
    cfg.reasoning_parser = Some(kvgate_sim::ReasoningParser::Qwen3);
    let sim = start(cfg).await;
    let (_, info) = get(sim.http_addr, "/get_server_info").await;
    assert_eq!(info["reasoning_parser"], "qwen3");
    let ids = prompt_ids();
    let body = json!({"model": MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": PROMPT}]});
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &body).await;
    let message = &out["choices"][0]["message"];
    let reasoning = message["reasoning_content"].as_str().unwrap();
    let content = message["content"].as_str().unwrap();
    assert!(
        !reasoning.trim().is_empty() && !reasoning.contains("think>"),
        "{reasoning}"
    );
    let rest = content.strip_prefix("\n\n").unwrap();
    let thought_tokens = QWEN3
        .encode(&format!("<think>{reasoning}</think>\n\n"), false)
        .unwrap()
        .len();
    assert_eq!(rest, echo(&ids, 20 - thought_tokens));
    assert_eq!(out["usage"]["completion_tokens"], 20);

    let (_, events) = post_sse(
        sim.http_addr,
        "/v1/chat/completions",
        &streamed(body.clone()),
    )
    .await;
    assert_eq!(joined(&events, "reasoning_content"), reasoning);
    assert_eq!(joined(&events, "content"), content);
    let all = deltas(&events);
    let last_reasoning = all
        .iter()
        .rposition(|d| d.get("reasoning_content").is_some())
        .unwrap();
    let first_content = all
        .iter()
        .position(|d| d["content"].as_str().is_some_and(|c| !c.is_empty()))
        .unwrap();
    assert!(last_reasoning < first_content, "the thought streams first");
    assert_eq!(completion_tokens(&events), 20);

    // separate_reasoning false keeps it inline; thinking off has none.
    let mut inline = body.clone();
    inline["separate_reasoning"] = json!(false);
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &inline).await;
    assert!(out["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("<think>"));
    assert_eq!(
        out["choices"][0]["message"]["reasoning_content"],
        Value::Null
    );
    let mut off = body.clone();
    off["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &off).await;
    assert_eq!(
        out["choices"][0]["message"]["reasoning_content"],
        Value::Null
    );
    assert_eq!(
        out["choices"][0]["message"]["content"],
        echo(&chat_prompt_ids(&off), 20)
    );
    // A budget the thought alone fills: all reasoning, no content, "length".
    let mut short = body;
    short["max_tokens"] = json!(4);
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &short).await;
    assert_eq!(out["choices"][0]["message"]["content"], "");
    assert!(out["choices"][0]["message"]["reasoning_content"].is_string());
    assert_eq!(out["choices"][0]["finish_reason"], "length");
    sim.shutdown().await;
}

#[tokio::test]
async fn in_pd_the_decode_answers_the_options_and_the_prefill_stays_plain() {
    let prefill = start(config(SimRole::Prefill)).await;
    let decode = start(config(SimRole::Decode)).await;
    let body = with_bootstrap(
        chat(json!({"tools": tools(), "tool_choice": "required", "n": 2})),
        &prefill,
        json!(31),
    );
    let ((p_status, p_out), (d_status, d_out)) =
        pd_post(&prefill, &decode, "/v1/chat/completions", &body).await;
    assert_eq!(p_status, StatusCode::OK, "{p_out}");
    assert_eq!(p_out["choices"][0]["message"]["content"], "");
    assert_eq!(p_out["choices"][0]["message"]["tool_calls"], Value::Null);
    assert_eq!(d_status, StatusCode::OK, "{d_out}");
    for i in 0..2 {
        let call = &d_out["choices"][i]["message"]["tool_calls"][0];
        assert_eq!(call["function"]["name"], "get_weather");
        check_weather_arguments(call["function"]["arguments"].as_str().unwrap());
        assert_eq!(d_out["choices"][i]["finish_reason"], "tool_calls");
    }
    prefill.shutdown().await;
    decode.shutdown().await;
}
