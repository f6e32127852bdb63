//! `from_chat`: engine completions (SGLang and vLLM shapes) → Anthropic messages.

use serde_json::{json, Value};

use super::{count_tokens_reply, from_chat, AnthropicError};

fn completion(message: Value, finish: &str) -> Value {
    json!({
        "id": "chatcmpl-abc123", "object": "chat.completion", "model": "served",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    })
}

#[test]
fn plain_text() {
    let m = from_chat(
        &completion(json!({"role": "assistant", "content": "Hi!"}), "stop"),
        "claude-x",
        &[],
    )
    .unwrap();
    assert_eq!(
        m,
        json!({"id": "msg_abc123", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "Hi!"}], "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 12, "output_tokens": 5}})
    );
}

#[test]
fn thinking_text_and_tool_use() {
    let msg = json!({"role": "assistant", "content": "Let me check.", "reasoning_content": "The user wants weather.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
    let m = from_chat(&completion(msg, "tool_calls"), "m", &[]).unwrap();
    assert_eq!(
        m["content"],
        json!([
            {"type": "thinking", "thinking": "The user wants weather.", "signature": ""},
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
        ])
    );
    assert_eq!(m["stop_reason"], "tool_use");
    // vLLM's newer field name, and `stop` with tool calls.
    let msg = json!({"role": "assistant", "content": null, "reasoning": "r",
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]});
    let m = from_chat(&completion(msg, "stop"), "m", &[]).unwrap();
    assert_eq!(m["content"][0]["thinking"], "r");
    assert_eq!(m["stop_reason"], "tool_use");
}

#[test]
fn stop_sequence_and_length() {
    let stops = vec!["END".to_owned()];
    let mut c = completion(json!({"role": "assistant", "content": "a"}), "stop");
    c["choices"][0]["matched_stop"] = json!("END");
    let m = from_chat(&c, "m", &stops).unwrap();
    assert_eq!(
        (m["stop_reason"].clone(), m["stop_sequence"].clone()),
        (json!("stop_sequence"), json!("END"))
    );
    // An EOS token id (integer) or a string that is not among the request's: end_turn.
    c["choices"][0]["matched_stop"] = json!(151645);
    assert_eq!(
        from_chat(&c, "m", &stops).unwrap()["stop_reason"],
        "end_turn"
    );
    c["choices"][0]["matched_stop"] = json!("</s>");
    assert_eq!(
        from_chat(&c, "m", &stops).unwrap()["stop_sequence"],
        Value::Null
    );
    // vLLM reports it as the choice's stop_reason.
    let mut v = completion(json!({"role": "assistant", "content": "a"}), "stop");
    v["choices"][0]["stop_reason"] = json!("END");
    assert_eq!(from_chat(&v, "m", &stops).unwrap()["stop_sequence"], "END");
    let l = completion(json!({"role": "assistant", "content": "a"}), "length");
    assert_eq!(
        from_chat(&l, "m", &[]).unwrap()["stop_reason"],
        "max_tokens"
    );
}

#[test]
fn untranslatable_replies_are_errors() {
    let bad_args = json!({"role": "assistant", "content": null,
        "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{not json"}}]});
    let e = from_chat(&completion(bad_args, "tool_calls"), "m", &[]).unwrap_err();
    assert!(matches!(e, AnthropicError::Upstream(_)), "{e}");
    assert_eq!(e.body()["error"]["type"], "api_error");
    let abort = completion(json!({"role": "assistant", "content": "a"}), "abort");
    assert!(from_chat(&abort, "m", &[]).is_err());
    let mut no_usage = completion(json!({"role": "assistant", "content": "a"}), "stop");
    no_usage.as_object_mut().unwrap().remove("usage");
    assert!(from_chat(&no_usage, "m", &[]).is_err());
}

#[test]
fn count_tokens_shape() {
    assert_eq!(count_tokens_reply(42), json!({"input_tokens": 42}));
}
