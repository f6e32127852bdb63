//! Anthropic's Messages API through the same front door: the official Anthropic SDK's
//! `messages.create` (plain, streamed, the tool loop) and `count_tokens` work against
//! kvgate; every request is translated to the chat the engine serves, admitted on its exact
//! count, guarded, and answered in Anthropic's shapes, errors included.

mod support;

use serde_json::json;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 4096;

async fn setup(fault: SimFault) -> (kvgate_sim::RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine(SimRole::Unified, fault, 40960, 32768).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    (engine, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_works_through_kvgate() {
    let Some(python) = anthropic_python() else {
        return;
    };
    let (_engine, gw) = setup(SimFault::None).await;
    let cases = run_anthropic_sdk(python, format!("http://{}", gw.data_addr()), "qwen3").await;
    for case in [
        "messages.create",
        "messages.stream",
        "messages.create.stream",
        "tool_loop",
        "messages.count_tokens",
        "too_long",
    ] {
        assert_eq!(cases[case]["ok"], true, "{case}: {cases:?}");
    }
    assert_eq!(cases["too_long"]["type"], "invalid_request_error");
    assert_eq!(cases["tool_loop"]["calls"][0]["name"], "get_weather");
    gw.shutdown().await;
}

#[tokio::test]
async fn messages_are_counted_exactly_and_answered_in_anthropics_shapes() {
    let (engine, gw) = setup(SimFault::None).await;
    let conversation = json!({
        "model": "qwen3",
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "What is a KV cache?"}]}],
        "thinking": {"type": "disabled"},
    });
    let counted = anthropic_post(&gw, "/v1/messages/count_tokens", &conversation).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let mut body = conversation.clone();
    body["max_tokens"] = json!(8);
    let reply = anthropic_post(&gw, "/v1/messages", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let message = reply.json();
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["model"], "qwen3");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert!(["end_turn", "max_tokens"].contains(&message["stop_reason"].as_str().unwrap()));
    // count_tokens is what the engine counted for the same conversation (the guard already
    // held the engine's count to admission's).
    assert_eq!(
        counted.json()["input_tokens"],
        message["usage"]["input_tokens"],
        "{message}"
    );
    // The engine got the chat the request translates to.
    let sent = generations(&engine);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path, "/v1/chat/completions");
    assert_eq!(sent[0].body["messages"][0]["role"], "system");
    assert_eq!(
        sent[0].body["chat_template_kwargs"]["enable_thinking"],
        false
    );

    // Refusals, in Anthropic's error shape, before any byte reaches the engine.
    let stranger = post(
        &format!("http://{}/v1/messages", gw.data_addr()),
        None,
        &body,
    )
    .await;
    assert_eq!(stranger.status, 401);
    assert_eq!(anthropic_error_type(&stranger), "authentication_error");
    let mut long = body.clone();
    long["messages"][0]["content"] = json!("word ".repeat(5000));
    let refused = anthropic_post(&gw, "/v1/messages", &long).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(anthropic_error_type(&refused), "invalid_request_error");
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tokens"));
    let mut unknown = body.clone();
    unknown["mcp_servers"] = json!([]);
    let refused = anthropic_post(&gw, "/v1/messages", &unknown).await;
    assert_eq!(anthropic_error_type(&refused), "invalid_request_error");
    assert!(refused.text().contains("mcp_servers"), "{}", refused.text());
    let mut long_count = long.clone();
    long_count.as_object_mut().unwrap().remove("max_tokens");
    let counted_long = anthropic_post(&gw, "/v1/messages/count_tokens", &long_count).await;
    assert_eq!(
        counted_long.status, 200,
        "count_tokens counts what it cannot admit"
    );
    assert_eq!(generations(&engine).len(), 1);

    // A stream: Anthropic's event sequence, its usage the engine's.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = anthropic_post(&gw, "/v1/messages", &streamed).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");
    assert!(names.contains(&"content_block_delta") && names.contains(&"message_delta"));
    assert!(
        !text.contains("[DONE]") && !text.contains("chat.completion"),
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn the_guard_stops_a_false_success_for_anthropic_clients_too() {
    let body = json!({"model": "qwen3", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hello"}]});
    // An error inside a 200 stream: Anthropic's `error` event, never `message_stop`.
    let (_engine, gw) = setup(SimFault::ErrorEvent).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = anthropic_post(&gw, "/v1/messages", &streamed).await;
    let text = reply.text();
    assert!(text.contains("event: error"), "{text}");
    assert!(!text.contains("message_stop"), "{text}");
    gw.shutdown().await;
    // An engine that counts another prompt: a 5xx in Anthropic's shape.
    let (_engine, gw) = setup(SimFault::WrongPromptTokens).await;
    let reply = anthropic_post(&gw, "/v1/messages", &body).await;
    assert!(reply.status.is_server_error(), "{}", reply.text());
    assert_eq!(anthropic_error_type(&reply), "api_error");
    gw.shutdown().await;
}
