//! The Responses → chat conversion, item by item, and SGLang's refusals with its text.

use super::*;
use crate::prepare::ChatRules;
use crate::ModelTokenizer;

fn chat(body: Value) -> Result<ResponsesChat, ResponsesError> {
    responses_to_chat(body.as_object().unwrap(), Vec::new(), false)
}

fn messages(body: Value) -> Value {
    chat(body).unwrap().messages
}

#[test]
fn string_input_is_one_user_message() {
    let out = chat(json!({"input": "hello"})).unwrap();
    assert_eq!(out.messages, json!([{"role": "user", "content": "hello"}]));
    assert_eq!(out.tools, None);
    // No tools: the chat's tool_choice is "none".
    assert_eq!(out.fields["tool_choice"], json!("none"));
    assert_eq!(out.fields["parallel_tool_calls"], json!(true));
    assert!(!out.fields.contains_key("max_tokens"));
}

#[test]
fn input_text_parts_become_text_parts() {
    let out = messages(json!({"input": [
        {"type": "message", "role": "user", "id": "msg_1", "status": "completed",
         "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
    ]}));
    assert_eq!(
        out,
        json!([{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    );
}

#[test]
fn developer_and_system_turns_coalesce_into_one_leading_block() {
    let body = json!({"instructions": "Be brief.", "input": [
        {"role": "user", "content": "q1"},
        {"role": "developer", "content": "use tools"},
        {"role": "system", "content": [{"type": "input_text", "text": "sys"}]},
    ]});
    let out = messages(body.clone());
    assert_eq!(
        out,
        json!([
            {"role": "system",
             "content": "Be brief.\n\nDeveloper instructions:\nuse tools\n\nsys"},
            {"role": "user", "content": "q1"},
        ])
    );
    // A template that renders inline system turns keeps them where they are.
    let inline = responses_to_chat(body.as_object().unwrap(), Vec::new(), true).unwrap();
    assert_eq!(inline.messages[2]["role"], "system");
    assert_eq!(
        inline.messages[2]["content"],
        "Developer instructions:\nuse tools"
    );
}

#[test]
fn tool_loop_items_become_assistant_tool_calls_and_tool_turns() {
    let stored = vec![json!({"role": "user", "content": "weather?"})];
    let body = json!({"input": [
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "oops"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ], "tools": [{"type": "function", "name": "get_weather"}, {"type": "function", "name": "get_time"}]});
    let out = responses_to_chat(body.as_object().unwrap(), stored, false).unwrap();
    assert_eq!(
        out.messages,
        json!([
            {"role": "user", "content": "weather?"},
            // Consecutive assistant turns merge; unparsable arguments are "{}".
            {"role": "assistant", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}},
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ])
    );
}

#[test]
fn tools_and_tool_choice_become_chat_tools() {
    let out = chat(json!({"input": "x", "tools": [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}},
        {"type": "web_search"},
    ], "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false}))
    .unwrap();
    assert_eq!(
        out.tools,
        Some(json!([{"type": "function", "function": {
            "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": false}}]))
    );
    assert_eq!(
        out.fields["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(out.fields["parallel_tool_calls"], json!(false));
    // A built-in tool choice is "auto".
    let auto = chat(
        json!({"input": "x", "tools": [{"type": "function", "name": "f"}],
        "tool_choice": {"type": "web_search"}}),
    )
    .unwrap();
    assert_eq!(auto.fields["tool_choice"], json!("auto"));
}

#[test]
fn max_output_tokens_leaves_two_tokens_of_headroom() {
    let out = chat(json!({"input": "x", "max_output_tokens": 100})).unwrap();
    assert_eq!(out.fields["max_tokens"], json!(98));
    let tiny = json!({"input": "x", "max_output_tokens": 1});
    assert_eq!(chat(tiny.clone()).unwrap().fields["max_tokens"], json!(0));
    let prompt = ResponsesPrompt::parse(tiny.as_object().unwrap()).unwrap();
    assert_eq!(
        prompt.max_tokens_error().as_deref(),
        Some("max_new_tokens must be at least 0, got -1.")
    );
}

#[test]
fn reasoning_and_text_format_reach_the_chat() {
    let out = chat(json!({"input": "x", "reasoning": {"effort": "none"},
        "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}}}))
    .unwrap();
    assert_eq!(out.fields["reasoning_effort"], json!("none"));
    assert_eq!(
        out.fields["chat_template_kwargs"],
        json!({"thinking": false, "enable_thinking": false})
    );
    assert_eq!(out.fields["response_format"]["type"], json!("json_schema"));
    // Plain text output adds no constraint.
    let plain = chat(json!({"input": "x", "text": {"format": {"type": "text"}}})).unwrap();
    assert!(!plain.fields.contains_key("response_format"));
}

#[test]
fn refusals_carry_sglang_text() {
    let refusal = |body: Value| chat(body).unwrap_err();
    assert_eq!(
        refusal(json!({"input": "x", "tools": [{"type": "shell"}]})),
        ResponsesError::Refused {
            message: "Shell tools are not supported by this model".into(),
            param: Some("tools"),
        }
    );
    assert_eq!(
        refusal(
            json!({"input": "x", "tool_choice": {"type": "function", "name": "g"},
            "tools": [{"type": "function", "name": "f"}]})
        ),
        ResponsesError::Refused {
            message: "Tool 'g' is not declared in tools".into(),
            param: Some("tool_choice"),
        }
    );
    let required = refusal(json!({"input": "x", "tool_choice": "required"}));
    assert!(required
        .to_string()
        .starts_with("tool_choice=\"required\" requires"));
    assert_eq!(
        refusal(json!({"input": [{"type": "custom_tool_call", "call_id": "c"}]})).to_string(),
        "Unsupported Responses API input item type: 'custom_tool_call' None"
    );
    assert_eq!(
        refusal(json!({"input": 3})),
        ResponsesError::Invalid("input: Input should be a valid string or list, got int".into())
    );
    assert_eq!(
        refusal(json!({"input": "x", "tools": [{"type": "function"}]})).to_string(),
        "tools.0: Value error, Function tools must include a name."
    );
    assert_eq!(refusal(json!({})).to_string(), "input: Field required");
}

#[test]
fn the_chat_renders_with_sglang_rules() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/tokenizers/qwen3");
    let tok = ModelTokenizer::from_dir(&dir).unwrap();
    // Qwen3's template renders a system turn anywhere: the developer turn stays inline.
    assert!(tok.inline_system_support());
    let body = json!({"instructions": "I", "input": [
        {"role": "user", "content": "hi"}, {"role": "developer", "content": "D"}]});
    let out = responses_to_chat(body.as_object().unwrap(), Vec::new(), true).unwrap();
    let prompt = tok.chat_prompt(ChatRules::Sglang, &out.request()).unwrap();
    assert!(
        prompt.rendered.starts_with(
            "<|im_start|>system\nI<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
             <|im_start|>system\nDeveloper instructions:\nD<|im_end|>\n"
        ),
        "{}",
        prompt.rendered
    );
}
