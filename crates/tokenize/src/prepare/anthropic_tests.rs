//! The Anthropic → SGLang chat conversion, rule by rule, its refusals, and a Claude-Code-like
//! tool loop checked against the exact chat JSON.

use super::*;

fn chat(body: Value) -> Result<Map<String, Value>, AnthropicChatError> {
    sglang_messages_chat(body.as_object().unwrap())
}

fn ok(body: Value) -> Value {
    Value::Object(chat(body).unwrap())
}

/// A messages body with these messages (and `extra` fields merged in).
fn body(messages: Value, extra: Value) -> Value {
    let mut b = json!({"model": "m", "max_tokens": 16, "messages": messages});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn messages_of(messages: Value) -> Value {
    ok(body(messages, json!({})))["messages"].clone()
}

#[track_caller]
fn unsupported_at(result: Result<Map<String, Value>, AnthropicChatError>, at: &str) {
    match result {
        Err(AnthropicChatError::Unsupported { path, reason }) => {
            assert_eq!(path, at, "{reason}");
            assert!(!reason.is_empty());
        }
        other => panic!("expected Unsupported at {at}, got {other:?}"),
    }
}

#[track_caller]
fn invalid_at(result: Result<Map<String, Value>, AnthropicChatError>, at: &str) {
    match result {
        Err(AnthropicChatError::Invalid { path, .. }) => assert_eq!(path, at),
        other => panic!("expected Invalid at {at}, got {other:?}"),
    }
}

#[test]
fn plain_request_has_the_chat_fields_in_order() {
    let out = ok(body(
        json!([{"role": "user", "content": "hi"}]),
        json!({"temperature": 0.5, "top_p": 1, "top_k": 40, "stop_sequences": ["END"], "metadata": {"user_id": "u"}}),
    ));
    assert_eq!(
        out,
        json!({"messages": [{"role": "user", "content": "hi"}], "model": "m", "max_tokens": 16,
               "stream": false, "temperature": 0.5, "top_p": 1, "top_k": 40, "stop": ["END"]})
    );
    let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "messages",
            "model",
            "max_tokens",
            "stream",
            "temperature",
            "top_p",
            "top_k",
            "stop"
        ]
    );
}

#[test]
fn streaming_asks_for_usage() {
    let out = ok(body(
        json!([{"role": "user", "content": "hi"}]),
        json!({"stream": true}),
    ));
    assert_eq!(out["stream"], true);
    assert_eq!(
        out["stream_options"],
        json!({"include_usage": true, "continuous_usage_stats": true})
    );
    let out = ok(body(
        json!([{"role": "user", "content": "hi"}]),
        json!({"stream": null}),
    ));
    assert_eq!(out["stream"], false);
    assert!(out.get("stream_options").is_none());
}

#[test]
fn request_model_refusals() {
    let user = json!([{"role": "user", "content": "hi"}]);
    invalid_at(chat(json!({"max_tokens": 1, "messages": user})), "model");
    invalid_at(
        chat(json!({"model": "", "max_tokens": 1, "messages": user})),
        "model",
    );
    invalid_at(chat(json!({"model": "m", "messages": user})), "max_tokens");
    invalid_at(
        chat(json!({"model": "m", "max_tokens": 0, "messages": user})),
        "max_tokens",
    );
    invalid_at(chat(json!({"model": "m", "max_tokens": 1})), "messages");
    unsupported_at(
        chat(body(user.clone(), json!({"max_tokens": 1.5}))),
        "max_tokens",
    );
    unsupported_at(
        chat(body(user.clone(), json!({"temperature": "hot"}))),
        "temperature",
    );
    unsupported_at(
        chat(body(user.clone(), json!({"stop_sequences": [1]}))),
        "stop_sequences",
    );
    unsupported_at(
        chat(body(user.clone(), json!({"frobnicate": 1}))),
        "frobnicate",
    );
    for key in [
        "thinking",
        "output_config",
        "betas",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
    ] {
        unsupported_at(
            chat(body(
                user.clone(),
                json!({key: {"type": "enabled", "budget_tokens": 1024}}),
            )),
            key,
        );
    }
    // Null is unset for every version.
    assert!(chat(body(
        user,
        json!({"thinking": null, "system": null, "tools": null})
    ))
    .is_ok());
}

#[test]
fn system_string_and_blocks() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let out = ok(body(user.clone(), json!({"system": "Be brief."})));
    assert_eq!(
        out["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    let out = ok(body(user.clone(), json!({"system": ""})));
    assert_eq!(out["messages"].as_array().unwrap().len(), 1);
    unsupported_at(
        chat(body(user.clone(), json!({"system": "  \n"}))),
        "system",
    );
    let blocks = json!([
        {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": ""},
        {"type": "text", "text": "B"},
    ]);
    let out = ok(body(user.clone(), json!({"system": blocks})));
    assert_eq!(
        out["messages"][0],
        json!({"role": "system", "content": "A\nB"})
    );
    let out = ok(body(user.clone(), json!({"system": []})));
    assert_eq!(out["messages"][0]["role"], "user");
    unsupported_at(
        chat(body(
            user.clone(),
            json!({"system": [{"type": "text", "text": ""}]}),
        )),
        "system",
    );
    unsupported_at(
        chat(body(
            user,
            json!({"system": [{"type": "image", "source": {}}]}),
        )),
        "system[0].type",
    );
}

#[test]
fn roles_and_string_content() {
    assert_eq!(
        messages_of(
            json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}])
        ),
        json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}])
    );
    unsupported_at(
        chat(body(json!([{"role": "system", "content": "s"}]), json!({}))),
        "messages[0].role",
    );
    invalid_at(
        chat(body(json!([{"role": "tool", "content": "s"}]), json!({}))),
        "messages[0].role",
    );
    invalid_at(
        chat(body(json!([{"role": "user", "content": 3}]), json!({}))),
        "messages[0].content",
    );
}

#[test]
fn text_blocks_become_a_string_or_parts() {
    assert_eq!(
        messages_of(
            json!([{"role": "user", "content": [{"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}}]}])
        ),
        json!([{"role": "user", "content": "one"}])
    );
    assert_eq!(
        messages_of(
            json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
        ),
        json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    );
    unsupported_at(
        chat(body(
            json!([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            json!({}),
        )),
        "messages[0].content[0].text",
    );
    unsupported_at(
        chat(body(json!([{"role": "user", "content": []}]), json!({}))),
        "messages[0].content",
    );
    unsupported_at(
        chat(body(
            json!([{"role": "assistant", "content": []}]),
            json!({}),
        )),
        "messages[0].content",
    );
}

#[test]
fn refused_block_types() {
    for kind in [
        "image",
        "document",
        "search_result",
        "tool_reference",
        "thinking",
        "redacted_thinking",
        "server_tool_use",
        "web_search_tool_result",
        "mystery",
    ] {
        let msgs = json!([{"role": "assistant", "content": [{"type": kind}, {"type": "text", "text": "x"}]}]);
        unsupported_at(chat(body(msgs, json!({}))), "messages[0].content[0].type");
    }
}

#[test]
fn tool_use_arguments_are_python_json_dumps() {
    let msgs = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"path": "/tmp/caf\u{e9}", "n": 1.0, "emoji": "\u{1F600}"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Ls"},
        ]},
    ]);
    assert_eq!(
        messages_of(msgs)[1],
        json!({"role": "assistant", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "Read",
             "arguments": "{\"path\": \"/tmp/caf\\u00e9\", \"n\": 1.0, \"emoji\": \"\\ud83d\\ude00\"}"}},
            {"id": "toolu_2", "type": "function", "function": {"name": "Ls", "arguments": "{}"}},
        ], "content": "Reading."})
    );
    let user_use = json!([{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}]}]);
    unsupported_at(chat(body(user_use, json!({}))), "messages[0].content[0]");
    let no_id =
        json!([{"role": "assistant", "content": [{"type": "tool_use", "name": "n", "input": {}}]}]);
    unsupported_at(chat(body(no_id, json!({}))), "messages[0].content[0].id");
    let huge: Value = serde_json::from_str(
        r#"[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"a": [1, 100000000000000000000]}}]}]"#,
    )
    .unwrap();
    unsupported_at(
        chat(body(huge, json!({}))),
        "messages[0].content[0].input.a[1]",
    );
    let bad_input = json!([{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n", "input": [1]}]}]);
    invalid_at(
        chat(body(bad_input, json!({}))),
        "messages[0].content[0].input",
    );
}

#[test]
fn tool_results_become_tool_messages() {
    let msgs = json!([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "text out"},
        {"type": "tool_result", "tool_use_id": "b", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": ""}]},
        {"type": "tool_result", "tool_use_id": "c", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
        {"type": "tool_result", "tool_use_id": "d", "content": []},
        {"type": "tool_result", "tool_use_id": "e", "is_error": true},
        {"type": "text", "text": "now continue"},
    ]}]);
    assert_eq!(
        messages_of(msgs),
        json!([
            {"role": "tool", "tool_call_id": "a", "content": "text out"},
            {"role": "tool", "tool_call_id": "b", "content": "one"},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
            {"role": "tool", "tool_call_id": "d", "content": ""},
            {"role": "tool", "tool_call_id": "e", "content": ""},
            {"role": "user", "content": "now continue"},
        ])
    );
    let text_first = json!([{"role": "user", "content": [
        {"type": "text", "text": "before"}, {"type": "tool_result", "tool_use_id": "a", "content": "x"},
    ]}]);
    unsupported_at(chat(body(text_first, json!({}))), "messages[0].content[1]");
    let image = json!([{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image", "source": {}}]},
    ]}]);
    unsupported_at(
        chat(body(image, json!({}))),
        "messages[0].content[0].content[0].type",
    );
    let in_assistant =
        json!([{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]);
    unsupported_at(
        chat(body(in_assistant, json!({}))),
        "messages[0].content[0]",
    );
    let no_id = json!([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]);
    unsupported_at(
        chat(body(no_id, json!({}))),
        "messages[0].content[0].tool_use_id",
    );
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "Weather.", "cache_control": {"type": "ephemeral"},
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

#[test]
fn tools_and_tool_choice() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let out = ok(body(
        user.clone(),
        json!({"tools": [weather_tool(), {"type": "custom", "name": "noop", "input_schema": {"type": "object"}}]}),
    ));
    assert_eq!(
        out["tools"],
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "noop", "description": "", "parameters": {"type": "object"}}},
        ])
    );
    assert_eq!(out["tool_choice"], "auto");
    let with = |choice: Value| {
        chat(body(
            user.clone(),
            json!({"tools": [weather_tool()], "tool_choice": choice}),
        ))
    };
    assert_eq!(
        with(json!({"type": "any"})).unwrap()["tool_choice"],
        "required"
    );
    assert_eq!(
        with(json!({"type": "none"})).unwrap()["tool_choice"],
        "none"
    );
    assert_eq!(
        with(json!({"type": "auto"})).unwrap()["tool_choice"],
        "auto"
    );
    assert_eq!(
        with(json!({"type": "tool", "name": "get_weather"})).unwrap()["tool_choice"],
        json!({"type": "function", "function": {"name": "get_weather"}})
    );
    invalid_at(
        with(json!({"type": "tool", "name": "other"})),
        "tool_choice.name",
    );
    invalid_at(with(json!({"type": "sometimes"})), "tool_choice.type");
    unsupported_at(
        with(json!({"type": "auto", "disable_parallel_tool_use": true})),
        "tool_choice.disable_parallel_tool_use",
    );
    // Without tools.
    let bare = |choice: Value| chat(body(user.clone(), json!({"tool_choice": choice})));
    assert_eq!(
        bare(json!({"type": "none"})).unwrap()["tool_choice"],
        "none"
    );
    assert!(bare(json!({"type": "auto"}))
        .unwrap()
        .get("tool_choice")
        .is_none());
    invalid_at(bare(json!({"type": "any"})), "tool_choice.type");
    invalid_at(
        bare(json!({"type": "tool", "name": "x"})),
        "tool_choice.type",
    );
    assert!(ok(body(user.clone(), json!({"tools": []})))
        .get("tools")
        .is_none());
}

#[test]
fn tool_refusals() {
    let user = json!([{"role": "user", "content": "hi"}]);
    let with = |tool: Value| chat(body(user.clone(), json!({"tools": [tool]})));
    unsupported_at(
        with(json!({"type": "web_search_20250305", "name": "web_search"})),
        "tools[0].type",
    );
    unsupported_at(
        with(json!({"type": "bash_20250124", "name": "bash"})),
        "tools[0].type",
    );
    unsupported_at(
        with(json!({"name": "t", "input_schema": {"properties": {}}})),
        "tools[0].input_schema.type",
    );
    unsupported_at(
        with(json!({"name": "t", "input_schema": {"type": "array"}})),
        "tools[0].input_schema.type",
    );
    unsupported_at(
        with(json!({"name": "t", "defer_loading": true, "input_schema": {"type": "object"}})),
        "tools[0].defer_loading",
    );
    invalid_at(with(json!({"name": "t"})), "tools[0].input_schema");
    invalid_at(
        with(json!({"input_schema": {"type": "object"}})),
        "tools[0].name",
    );
    unsupported_at(
        with(json!({"name": "t", "input_schema": {"type": "object"}, "strict": true})),
        "tools[0].strict",
    );
}

#[test]
fn count_tokens_is_the_same_chat_with_one_token_and_no_stream() {
    let b = json!({"model": "m", "system": "S", "messages": [{"role": "user", "content": "hi"}], "tools": [weather_tool()]});
    let out = sglang_count_tokens_chat(b.as_object().unwrap()).unwrap();
    assert_eq!(out["max_tokens"], 1);
    assert_eq!(out["stream"], false);
    assert_eq!(
        out["messages"][0],
        json!({"role": "system", "content": "S"})
    );
    assert_eq!(out["tool_choice"], "auto");
    for extra in [
        json!({"max_tokens": 5}),
        json!({"stream": true}),
        json!({"thinking": {"type": "enabled"}}),
        json!({"output_config": {}}),
    ] {
        let mut b = b.clone();
        let (k, v) = extra.as_object().unwrap().iter().next().unwrap();
        b[k] = v.clone();
        assert!(
            matches!(
                sglang_count_tokens_chat(b.as_object().unwrap()),
                Err(AnthropicChatError::Unsupported { .. })
            ),
            "{k}"
        );
    }
}

#[test]
fn claude_code_like_tool_loop() {
    let request = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "temperature": 1,
        "metadata": {"user_id": "user_abc_session_1"},
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Working directory: /repo", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [
            {"name": "Bash", "description": "Run a shell command.", "input_schema": {
                "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
                "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}},
            {"name": "Read", "description": "Read a file.", "input_schema": {
                "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
        ],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                {"type": "text", "text": "List the files, then read README.md", "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "I'll list the files."},
                {"type": "tool_use", "id": "toolu_01A", "name": "Bash", "input": {"command": "ls -la"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01A", "content": "README.md\nsrc\n", "is_error": false},
            ]},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_01B", "name": "Read", "input": {"file_path": "/repo/README.md"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01B", "content": [{"type": "text", "text": "# kvgate\n"}]},
                {"type": "text", "text": "Summarize it.", "cache_control": {"type": "ephemeral"}},
            ]},
        ],
    });
    let expected = json!({
        "messages": [
            {"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude.\nWorking directory: /repo"},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                {"type": "text", "text": "List the files, then read README.md"},
            ]},
            {"role": "assistant", "tool_calls": [{"id": "toolu_01A", "type": "function",
                "function": {"name": "Bash", "arguments": "{\"command\": \"ls -la\"}"}}],
             "content": "I'll list the files."},
            {"role": "tool", "tool_call_id": "toolu_01A", "content": "README.md\nsrc\n"},
            {"role": "assistant", "tool_calls": [{"id": "toolu_01B", "type": "function",
                "function": {"name": "Read", "arguments": "{\"file_path\": \"/repo/README.md\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_01B", "content": "# kvgate\n"},
            {"role": "user", "content": "Summarize it."},
        ],
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "stream": true,
        "temperature": 1,
        "stream_options": {"include_usage": true, "continuous_usage_stats": true},
        "tools": [
            {"type": "function", "function": {"name": "Bash", "description": "Run a shell command.", "parameters": {
                "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
                "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}}},
            {"type": "function", "function": {"name": "Read", "description": "Read a file.", "parameters": {
                "type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}},
        ],
        "tool_choice": "auto",
    });
    assert_eq!(ok(request), expected);
}

#[test]
fn errors_name_the_path() {
    let err = chat(body(json!([{"role": "system", "content": "s"}]), json!({}))).unwrap_err();
    assert!(err.to_string().starts_with("messages[0].role: "), "{err}");
}
