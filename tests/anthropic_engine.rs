//! Anthropic's Messages API passed straight through to an engine that serves it itself
//! (`[[models]] anthropic_messages = "engine"`; SGLang's `/v1/messages`): the client's body
//! goes as it is, counted as the chat SGLang builds from it, admitted on that count before
//! any byte goes out, and the engine's own Anthropic answer is guarded in its own shape.

mod support;

use serde_json::json;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 4096;

/// The gateway config: one unified SGLang pool without per-tenant salts (SGLang's
/// Anthropic request has no `cache_salt`), the model passed through.
fn passthrough_config(engine: &kvgate_sim::RunningSim) -> String {
    config_with_pools(
        WINDOW,
        &format!(
            "{}cache_salt = false\n",
            unified_pool("u", &[worker(engine, None)])
        ),
    )
    .replace(
        &model_table("qwen3", WINDOW),
        &format!(
            "{}anthropic_messages = \"engine\"\n",
            model_table("qwen3", WINDOW)
        ),
    )
}

async fn setup(fault: SimFault) -> (kvgate_sim::RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine(SimRole::Unified, fault, 40960, 32768).await;
    let gw = gateway(&passthrough_config(&engine)).await;
    (engine, gw)
}

/// The names of a stream's events, in order.
fn event_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_works_when_the_engine_serves_messages_itself() {
    let Some(python) = anthropic_python() else {
        return;
    };
    let (engine, gw) = setup(SimFault::None).await;
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
    // Every generation went to the engine's own `/v1/messages`, never as a chat.
    let sent = generations(&engine);
    assert!(!sent.is_empty());
    assert!(
        sent.iter().all(|r| r.path == "/v1/messages"),
        "{:?}",
        sent.iter().map(|r| &r.path).collect::<Vec<_>>()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn messages_for_the_engine_are_counted_as_sglang_builds_them_and_sent_as_they_came() {
    let (engine, gw) = setup(SimFault::None).await;
    let body = json!({
        "model": "qwen3",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use metric units."}],
        "metadata": {"user_id": "u-1"},
        "tools": [{"name": "get_weather", "description": "Weather of a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Zürich?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Zürich"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "12 °C, rain"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ],
    });
    let mut count_body = body.clone();
    let count_map = count_body.as_object_mut().unwrap();
    count_map.remove("max_tokens");
    count_map.remove("metadata");
    let counted = anthropic_post(&gw, "/v1/messages/count_tokens", &count_body).await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    let reply = anthropic_post(&gw, "/v1/messages", &body).await;
    assert_eq!(
        reply.status,
        200,
        "{} {:?}",
        reply.text(),
        gw.audit().recent()
    );
    let message = reply.json();
    assert_eq!(message["type"], "message", "{message}");
    let usage = &message["usage"];
    let engine_prompt = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
    // kvgate's count is the engine's (the guard also held the engine's count to it).
    assert_eq!(
        counted.json()["input_tokens"],
        json!(engine_prompt),
        "{message}"
    );

    // The engine got the client's body unchanged: no chat, no salt, no rid.
    let sent = generations(&engine);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path, "/v1/messages");
    let mut expected = body.clone();
    expected["model"] = json!("qwen3");
    assert_eq!(sent[0].body, expected);

    // Over the window: refused before dispatch, in Anthropic's shape.
    let mut long = body.clone();
    long["messages"][0]["content"] = json!("word ".repeat(5000));
    let refused = anthropic_post(&gw, "/v1/messages", &long).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert_eq!(anthropic_error_type(&refused), "invalid_request_error");
    assert!(refused.text().contains("tokens"), "{}", refused.text());
    // A shape whose prompt depends on the SGLang version or its flags: refused, named.
    let mut thinking = body.clone();
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    let refused = anthropic_post(&gw, "/v1/messages", &thinking).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("thinking"), "{}", refused.text());
    assert_eq!(
        generations(&engine).len(),
        1,
        "nothing refused reached the engine"
    );

    // A stream passes as the engine wrote it, ending in message_stop.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let reply = anthropic_post(&gw, "/v1/messages", &streamed).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    let names = event_names(&text);
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(names.last(), Some(&"message_stop"), "{text}");
    assert!(names.contains(&"message_delta"), "{text}");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_guard_stops_false_successes_in_the_engines_own_anthropic_answers() {
    let body = json!({"model": "qwen3", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "hello there"}]});
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);

    // An engine that counts another prompt (a placeholder): a 5xx, and in a stream an
    // `error` event instead of the message.
    let (_engine, gw) = setup(SimFault::WrongPromptTokens).await;
    let reply = anthropic_post(&gw, "/v1/messages", &body).await;
    assert!(reply.status.is_server_error(), "{}", reply.text());
    assert_eq!(anthropic_error_type(&reply), "api_error");
    let text = anthropic_post(&gw, "/v1/messages", &streamed).await.text();
    let names = event_names(&text);
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"), "{text}");
    gw.shutdown().await;

    // An error event mid-stream (SGLang follows it with message_stop): the client never
    // gets the message_stop that would tell its SDK the message is whole.
    let (_engine, gw) = setup(SimFault::ErrorEvent).await;
    let text = anthropic_post(&gw, "/v1/messages", &streamed).await.text();
    let names = event_names(&text);
    assert!(names.contains(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"), "{text}");
    gw.shutdown().await;

    // A stream cut before its end: an error event, never a message that looks whole.
    let (_engine, gw) = setup(SimFault::CutStream).await;
    let text = anthropic_post(&gw, "/v1/messages", &streamed).await.text();
    let names = event_names(&text);
    assert_eq!(names.last(), Some(&"error"), "{text}");
    assert!(!names.contains(&"message_stop"), "{text}");
    gw.shutdown().await;
}

/// The quiet leak (an engine answering from another tenant's stale pages with the right
/// counts and a normal finish) through the engine's own `/v1/messages`: the leak detector
/// reads the engine's Anthropic text, whole and streamed.
#[tokio::test]
async fn a_silent_leak_through_the_engines_own_messages_api_is_stopped() {
    const SECRET: &str = "ZEBRA-4471-QUOKKA";
    let alice_prompt = format!("{} The secret code is {SECRET}.", "lorem ".repeat(300));
    let bob_prompt = alice_prompt
        .replace("lorem", "ipsum")
        .replace(SECRET, "PANDA-9912-WOMBAT");
    for (mode, stream) in [("off", false), ("block", false), ("block", true)] {
        let engine = engine(SimRole::Unified, SimFault::SilentLeak, 40960, 32768).await;
        let config = format!(
            "[audit]\nsink = \"none\"\n[upstream]\ndiscovery_interval = \"1h\"\n[isolation]\nngram = 8\nmin_matches = 2\n{}anthropic_messages = \"engine\"\n{}cache_salt = false\nleak_detection = \"{mode}\"\n{}{}",
            model_table("qwen3", WINDOW),
            unified_pool("u", &[worker(&engine, None)]),
            tenant_table("alice", "sk-alice"),
            tenant_table("bob", "sk-bob")
        );
        let gw = gateway(&config).await;
        let url = format!("http://{}/v1/messages", gw.data_addr());
        let message = |prompt: &str, stream: bool| {
            json!({"model": "qwen3", "max_tokens": 80, "stream": stream,
                   "messages": [{"role": "user", "content": prompt}]})
        };
        let alice = post(&url, Some("sk-alice"), &message(&alice_prompt, false)).await;
        assert_eq!(alice.status, 200, "{}", alice.text());
        let bob = post(&url, Some("sk-bob"), &message(&bob_prompt, stream)).await;
        let text = bob.text();
        if assert_leak_outcome(mode, stream, &bob, &text, &gw, "QUOKKA") && !stream {
            assert_eq!(anthropic_error_type(&bob), "api_error");
        }
        gw.shutdown().await;
    }
}
