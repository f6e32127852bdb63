//! `to_chat` and `count_tokens_to_chat`: SDK-shaped bodies and bad inputs naming the field.

use serde_json::{json, Map, Value};

use super::{count_tokens_to_chat, to_chat, AnthropicError};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn chat(v: Value) -> Value {
    Value::Object(to_chat(&obj(v)).unwrap())
}

fn refused(v: Value) -> AnthropicError {
    to_chat(&obj(v)).unwrap_err()
}

fn path(e: &AnthropicError) -> &str {
    match e {
        AnthropicError::InvalidRequest { path, .. } | AnthropicError::Unsupported { path, .. } => {
            path
        }
        AnthropicError::Upstream(_) => "",
    }
}

#[test]
fn plain_chat() {
    let c = chat(json!({
        "model": "qwen3", "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hello"}],
        "temperature": 0.5, "top_p": 0.9, "top_k": 20,
        "stop_sequences": ["END"], "metadata": {"user_id": "u-1"},
    }));
    assert_eq!(
        c,
        json!({
            "model": "qwen3",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 64, "stop": ["END"],
            "temperature": 0.5, "top_p": 0.9, "top_k": 20, "user": "u-1",
        })
    );
}

#[test]
fn system_blocks_lead_and_are_joined() {
    let c = chat(json!({
        "model": "m", "max_tokens": 8,
        "system": [
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
            {"type": "text", "text": "Answer in French."},
        ],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}],
    }));
    assert_eq!(
        c["messages"][0],
        json!({"role": "system", "content": "You are terse.\nAnswer in French."})
    );
    assert_eq!(
        c["messages"][1]["content"],
        json!([{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}])
    );
    let s = chat(
        json!({"model": "m", "max_tokens": 8, "system": "Be brief.", "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(
        s["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
}

#[test]
fn sdk_tool_loop() {
    let c = chat(json!({
        "model": "m", "max_tokens": 128,
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
                {"type": "text", "text": "Checking.", "citations": null},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21C"}, {"type": "text", "text": "sunny"}]},
                {"type": "text", "text": "Thanks"},
            ]},
            {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "abc"}, {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true}]},
        ],
    }));
    assert_eq!(
        c["tools"],
        json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
            "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}}])
    );
    assert!(c.get("tool_choice").is_none());
    let m = c["messages"].as_array().unwrap();
    assert_eq!(m.len(), 6);
    assert_eq!(
        m[1],
        json!({"role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.",
            "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})
    );
    assert_eq!(
        m[2],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "21C\nsunny"})
    );
    assert_eq!(m[3], json!({"role": "user", "content": "Thanks"}));
    assert_eq!(m[4]["content"], Value::Null);
    assert_eq!(m[4]["tool_calls"][0]["function"]["arguments"], "{}");
    assert_eq!(
        m[5],
        json!({"role": "tool", "tool_call_id": "toolu_2", "content": "boom"})
    );
    assert!(c.get("continue_final_message").is_none());
}

#[test]
fn tool_choice_variants() {
    let with = |choice: Value| {
        chat(
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": choice}),
        )
    };
    assert_eq!(with(json!({"type": "auto"}))["tool_choice"], "auto");
    assert_eq!(with(json!({"type": "any"}))["tool_choice"], "required");
    assert_eq!(with(json!({"type": "none"}))["tool_choice"], "none");
    let named = with(json!({"type": "tool", "name": "f", "disable_parallel_tool_use": true}));
    assert_eq!(
        named["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(named["parallel_tool_calls"], false);
    let e = to_chat(&obj(json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "g"}}))).unwrap_err();
    assert_eq!(path(&e), "tool_choice.name");
    let e = refused(
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}}),
    );
    assert_eq!(path(&e), "tool_choice");
    let e = refused(
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]}),
    );
    assert_eq!(path(&e), "tools.0.type");
}

#[test]
fn thinking_on_and_off() {
    let base =
        json!({"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "x"}]});
    let mut on = base.clone();
    on["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    assert_eq!(
        chat(on)["chat_template_kwargs"],
        json!({"enable_thinking": true})
    );
    let mut off = base.clone();
    off["thinking"] = json!({"type": "disabled"});
    assert_eq!(
        chat(off)["chat_template_kwargs"],
        json!({"enable_thinking": false})
    );
    assert!(chat(base.clone()).get("chat_template_kwargs").is_none());
    let mut over = base.clone();
    over["thinking"] = json!({"type": "enabled", "budget_tokens": 4096});
    assert_eq!(path(&refused(over)), "thinking.budget_tokens");
    let mut missing = base;
    missing["thinking"] = json!({"type": "enabled"});
    assert_eq!(path(&refused(missing)), "thinking.budget_tokens");
}

#[test]
fn stream_asks_for_usage_and_images_translate() {
    let c = chat(
        json!({"model": "m", "max_tokens": 8, "stream": true, "service_tier": "auto",
        "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
            {"type": "text", "text": "What is this?"},
        ]}]}),
    );
    assert_eq!(c["stream"], true);
    assert_eq!(c["stream_options"], json!({"include_usage": true}));
    assert!(c.get("service_tier").is_none());
    assert_eq!(
        c["messages"][0]["content"][0],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    );
    assert_eq!(
        c["messages"][0]["content"][1]["image_url"]["url"],
        "https://x/y.png"
    );
}

#[test]
fn final_assistant_turn_is_continued() {
    let c = chat(json!({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi"}]}));
    assert_eq!(c["continue_final_message"], true);
    assert_eq!(c["add_generation_prompt"], false);
}

#[test]
fn bad_inputs_name_the_field() {
    let cases = [
        (
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        (
            json!({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}),
            "max_tokens",
        ),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}),
            "model",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": []}),
            "messages",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "temperature": 1.5}),
            "temperature",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "mcp_servers": []}),
            "mcp_servers",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}),
            "frobnicate",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "metadata": {"tenant": "a"}}),
            "metadata.tenant",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}),
            "messages.0.role",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "bogus"}]}]}),
            "messages.1.content.1.type",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}),
            "messages.0.content.0.type",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]}),
            "messages.0.content.0.type",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": "x"}]}]}),
            "messages.0.content.0.input",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]}),
            "messages.0.content.0.tool_use_id",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]}),
            "messages.0.content.0.source.type",
        ),
        (
            json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]}),
            "messages.0.content.0.extra",
        ),
    ];
    for (body, want) in cases {
        let e = refused(body.clone());
        assert_eq!(path(&e), want, "{body}: {e}");
        assert_eq!(e.body()["error"]["type"], "invalid_request_error");
    }
}

#[test]
fn count_tokens_body() {
    let body = json!({"model": "m", "system": "S", "messages": [{"role": "user", "content": "x"}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "thinking": {"type": "disabled"}});
    let c = Value::Object(count_tokens_to_chat(&obj(body)).unwrap());
    assert!(c.get("max_tokens").is_none());
    assert_eq!(c["messages"].as_array().unwrap().len(), 2);
    assert_eq!(c["chat_template_kwargs"]["enable_thinking"], false);
    assert_eq!(c["tools"][0]["function"]["name"], "f");
    let e = count_tokens_to_chat(&obj(
        json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}),
    ))
    .unwrap_err();
    assert_eq!(path(&e), "max_tokens");
}
