//! The request shapes real clients send, through kvgate to simulated engines that prepare
//! chats as SGLang (or llama.cpp) does: each is served with the engine's exact prompt count
//! (the guard's tolerance is 0, so a count that disagrees would be a 502), the template
//! controls reach the engine, and what the engine would refuse is refused with its reason.

mod support;

use kvgate_sim::SimConfig;
use kvgate_tokenize::{ChatRequest, ChatRules};
use serde_json::{json, Value};
use support::*;

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}])
}

/// The shapes the issue lists, each a chat completions body (model and max_tokens added).
fn shapes() -> Vec<(&'static str, Value)> {
    let user = json!({"role": "user", "content": "What is the weather in Paris?"});
    let call = json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}});
    vec![
        ("plain", json!({"messages": [user]})),
        (
            "sdk_tool_loop",
            json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"}], "tools": tools()}),
        ),
        (
            "content_parts",
            json!({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Two parts:"}, {"type": "text", "text": "what is KV?"}]}]}),
        ),
        ("tools_auto", json!({"messages": [user], "tools": tools()})),
        (
            "tool_choice_none",
            json!({"messages": [user], "tools": tools(), "tool_choice": "none"}),
        ),
        (
            "tool_choice_named",
            json!({"messages": [user], "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
        ),
        (
            "trailing_assistant",
            json!({"messages": [user, {"role": "assistant", "content": "It is"}]}),
        ),
        (
            "continue_final_message",
            json!({"messages": [user, {"role": "assistant", "content": "It is"}], "continue_final_message": true}),
        ),
        (
            "enable_thinking_false",
            json!({"messages": [user], "chat_template_kwargs": {"enable_thinking": false}}),
        ),
        (
            "reasoning_effort",
            json!({"messages": [user], "reasoning_effort": "none"}),
        ),
        (
            "both_token_limits",
            json!({"messages": [user], "max_completion_tokens": 6, "max_tokens": 12}),
        ),
    ]
}

/// One simulated SGLang engine and kvgate in front of it (window and pool 40960 tokens).
async fn engine_and_gateway() -> (kvgate_sim::RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine_with(SimConfig {
        model: "qwen3".into(),
        kv_tokens: 40960,
        context_length: 40960,
        ..SimConfig::default()
    })
    .await;
    let pool = unified_pool("p", &[worker(&engine, Some(40960))]);
    let gw = gateway(&config_with_pools(40960, &pool)).await;
    (engine, gw)
}

fn count(rules: ChatRules, body: &Value) -> u64 {
    let request = ChatRequest::from_body(body.as_object().expect("object")).expect("messages");
    let tokenizer = qwen3();
    let prompt = tokenizer.chat_prompt(rules, &request).expect("renders");
    tokenizer.count_chat_prompt(&prompt).expect("counts") as u64
}

fn with_model(mut body: Value) -> Value {
    body["model"] = json!("qwen3");
    if body.get("max_completion_tokens").is_none() {
        body["max_tokens"] = json!(8);
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_is_served_with_the_engines_exact_count() {
    let (engine, gw) = engine_and_gateway().await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for (name, body) in shapes() {
        let body = with_model(body);
        let reply = post(&url, Some(KEY), &body).await;
        assert_eq!(reply.status, 200, "{name}: {}", reply.text());
        let usage = &reply.json()["usage"];
        assert_eq!(
            usage["prompt_tokens"].as_u64(),
            Some(count(ChatRules::Sglang, &body)),
            "{name}"
        );
        // The template controls reached the engine as the client sent them.
        let sent = generations(&engine)
            .last()
            .cloned()
            .expect("the engine got it");
        for field in [
            "chat_template_kwargs",
            "reasoning_effort",
            "continue_final_message",
            "tool_choice",
        ] {
            assert_eq!(sent.body.get(field), body.get(field), "{name}: {field}");
        }
        if name == "both_token_limits" {
            // max_completion_tokens wins (SGLang's `max_completion_tokens or max_tokens`).
            assert!(
                usage["completion_tokens"].as_u64().unwrap_or(0) <= 6,
                "{usage}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_of_different_engines_count_each_by_its_own_rules() {
    let sglang = engine_with(SimConfig {
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await;
    let llama = engine_with(SimConfig {
        model: "qwen3".into(),
        chat_rules: ChatRules::LlamaCpp,
        ..SimConfig::default()
    })
    .await;
    let body = with_model(
        json!({"messages": [{"role": "user", "content": "Hi"}], "tools": tools(), "tool_choice": "none"}),
    );
    let (short, long) = (
        count(ChatRules::Sglang, &body),
        count(ChatRules::LlamaCpp, &body),
    );
    assert!(
        short + 50 < long,
        "SGLang drops the tools for \"none\", llama.cpp keeps them"
    );
    let pools = format!(
        "{}[[pools]]\nname = \"llama\"\nmodel = \"qwen3\"\nengine = \"openai\"\nchat_rules = \"llama_cpp\"\nmode = \"unified\"\nworkers = [{}]\n",
        unified_pool("sglang", &[worker(&sglang, Some(40960))]),
        worker(&llama, Some(40960)),
    );
    let config = config_with_pools(40960, &pools).replace(
        "[[tenants]]\nname = \"t1\"",
        "[[tenants]]\nname = \"t1\"\nchoose_pool = true",
    );
    let gw = gateway(&config).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for (pool, want) in [("sglang", short), ("llama", long)] {
        let reply = post_with(&url, Some(KEY), &[("x-kvgate-pool", pool)], &body).await;
        assert_eq!(reply.status, 200, "{pool}: {}", reply.text());
        assert_eq!(
            reply.json()["usage"]["prompt_tokens"].as_u64(),
            Some(want),
            "{pool}"
        );
    }
    // A window between the two counts: only the pool whose engine counts less can take it.
    let tight = gateway(&config_with_pools(long - 10, &pools)).await;
    let url = format!("http://{}/v1/chat/completions", tight.data_addr());
    for _ in 0..4 {
        let reply = post(&url, Some(KEY), &body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["prompt_tokens"].as_u64(), Some(short));
    }
    // Only the one request pinned to it above reached the llama.cpp-rules engine.
    assert_eq!(generations(&llama).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_engine_refuses_is_refused_before_it_with_the_engines_reason() {
    let (engine, gw) = engine_and_gateway().await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let user = json!({"role": "user", "content": "Hi"});
    for (body, says) in [
        (
            json!({"messages": [user], "tool_choice": "required"}),
            "Tools cannot be empty if tool choice is set to required.",
        ),
        (
            json!({"messages": [user], "tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "Tool 'nope' not found in tools list.",
        ),
        (
            json!({"messages": [user, {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{oops"}}]}]}),
            "Assistant tool call function.arguments must be valid JSON.",
        ),
        (
            json!({"messages": [user], "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
            "Request-supplied chat_template is not allowed",
        ),
    ] {
        let reply = post(&url, Some(KEY), &with_model(body)).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert!(error_message(&reply).contains(says), "{}", reply.text());
    }
    assert!(
        generations(&engine).is_empty(),
        "nothing refused reached the engine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_that_raises_is_a_400_naming_the_model() {
    // A model whose template refuses roles that do not alternate (as Llama 2's and Gemma's do).
    let dir = std::env::temp_dir().join(format!("kvgate-raise-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let template = "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{{ m['content'] }}{% endfor %}";
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"chat_template": template, "eos_token": "<|im_end|>"}).to_string(),
    )
    .expect("config");
    let tokenizer = repo().join("config/tokenizers/qwen3/tokenizer.json");
    let engine = engine_with(SimConfig {
        model: "strict".into(),
        ..SimConfig::default()
    })
    .await;
    let pools = unified_pool("p", &[worker(&engine, Some(40960))])
        + &unified_pool("s", &[worker(&engine, Some(40960))])
            .replace("model = \"qwen3\"", "model = \"strict\"");
    let config = config_with_pools(4096, &pools)
        + &format!(
            "\n[[models]]\nname = \"strict\"\ntokenizer = \"{}\"\nchat_template = \"{}\"\ncontext_window = 4096\n",
            tokenizer.display(),
            dir.join("tokenizer_config.json").display()
        );
    let gw = gateway(&config).await;
    let body = json!({"model": "strict", "max_tokens": 4, "messages": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}]});
    let reply = post(
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let message = error_message(&reply);
    assert!(
        message.contains("Conversation roles must alternate") && message.contains("`strict`"),
        "{message}"
    );
    assert!(generations(&engine).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_retrieve_and_denied_template_kwargs() {
    let engine = engine_with(SimConfig {
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await;
    let config = config_with_pools(40960, &unified_pool("p", &[worker(&engine, Some(40960))]))
        + &tenant_table("guarded", "sk-guarded").replace(
            "api_key_sha256",
            "denied_chat_template_kwargs = [\"enable_thinking\"]\napi_key_sha256",
        );
    let gw = gateway(&config).await;
    let base = format!("http://{}", gw.data_addr());
    let model = get(&format!("{base}/v1/models/qwen3"), Some(KEY)).await;
    assert_eq!(model.status, 200, "{}", model.text());
    assert_eq!(model.json()["id"], "qwen3");
    assert_eq!(model.json()["object"], "model");
    let missing = get(&format!("{base}/v1/models/nope"), Some(KEY)).await;
    assert_eq!(missing.status, 404);
    assert_eq!(error_code(&missing), "model_not_found");
    let unauthenticated = get(&format!("{base}/v1/models/qwen3"), None).await;
    assert_eq!(unauthenticated.status, 401);
    // A tenant an operator kept from a template variable gets 403; others may set it.
    let body = with_model(
        json!({"messages": [{"role": "user", "content": "Hi"}], "chat_template_kwargs": {"enable_thinking": false}}),
    );
    let url = format!("{base}/v1/chat/completions");
    let denied = post(&url, Some("sk-guarded"), &body).await;
    assert_eq!(denied.status, 403, "{}", denied.text());
    assert_eq!(error_code(&denied), "template_kwarg_not_allowed");
    let allowed = post(&url, Some(KEY), &body).await;
    assert_eq!(allowed.status, 200, "{}", allowed.text());
}

/// The official OpenAI Python SDK against kvgate: models.retrieve, content parts,
/// enable_thinking, and the tool loop plain and streamed (`tests/sdk/openai_client.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_tool_loop_works_through_kvgate() {
    let Some(python) = sdk_python() else {
        return;
    };
    let (_engine, gw) = engine_and_gateway().await;
    run_openai_sdk(
        python,
        format!("http://{}/v1", gw.data_addr()),
        &[],
        String::new,
    )
    .await;
}

/// The exact count is the boundary: a tenant whose prompt cap is the shape's count is
/// served, one whose cap is one less is refused with `context_length_exceeded` before the
/// engine sees the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prepared_count_is_the_admission_boundary() {
    let (engine, _) = engine_and_gateway().await;
    for (name, body) in shapes() {
        let body = with_model(body);
        let n = count(ChatRules::Sglang, &body);
        let tenants = format!(
            "{}max_prompt_tokens = {n}\n{}max_prompt_tokens = {}\n",
            tenant_table("exact", "sk-exact"),
            tenant_table("short", "sk-short"),
            n - 1
        );
        let gw = gateway(
            &(config_with_pools(40960, &unified_pool("p", &[worker(&engine, Some(40960))]))
                + &tenants),
        )
        .await;
        let url = format!("http://{}/v1/chat/completions", gw.data_addr());
        let before = generations(&engine).len();
        let refused = post(&url, Some("sk-short"), &body).await;
        assert_eq!(refused.status, 400, "{name}: {}", refused.text());
        assert_eq!(error_code(&refused), "context_length_exceeded", "{name}");
        assert_eq!(
            generations(&engine).len(),
            before,
            "{name}: refused before the engine"
        );
        let served = post(&url, Some("sk-exact"), &body).await;
        assert_eq!(served.status, 200, "{name}: {}", served.text());
        assert_eq!(
            served.json()["usage"]["prompt_tokens"].as_u64(),
            Some(n),
            "{name}"
        );
        gw.shutdown().await;
    }
}
