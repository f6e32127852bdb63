//! `StreamTranslator`: chunk sequences as SGLang and vLLM stream them.

use serde_json::{json, Value};

use super::{error_event, Event, StreamTranslator};

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": null})
}

fn usage_chunk(prompt: u64, completion: u64) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}})
}

fn run(t: &mut StreamTranslator, chunks: &[Value]) -> Vec<Event> {
    let mut events = Vec::new();
    for c in chunks {
        events.extend(t.on_chunk(c).unwrap());
    }
    events.extend(t.finish());
    events
}

fn names(events: &[Event]) -> Vec<&'static str> {
    events.iter().map(|e| e.name).collect()
}

#[test]
fn streamed_text() {
    let mut t = StreamTranslator::new("claude-x", "msg_1").with_input_tokens(9);
    let events = run(
        &mut t,
        &[
            chunk(json!({"role": "assistant", "content": ""}), None),
            chunk(json!({"content": "Hel"}), None),
            chunk(json!({"content": "lo"}), None),
            chunk(json!({}), Some("stop")),
            usage_chunk(9, 2),
        ],
    );
    assert_eq!(
        names(&events),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[0].data["message"]["usage"],
        json!({"input_tokens": 9, "output_tokens": 0})
    );
    assert_eq!(events[0].data["message"]["id"], "msg_1");
    assert_eq!(
        events[1].data,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert_eq!(
        events[3].data["delta"],
        json!({"type": "text_delta", "text": "lo"})
    );
    assert_eq!(
        events[5].data,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
            "usage": {"input_tokens": 9, "output_tokens": 2}})
    );
    assert_eq!(
        events[6].to_sse(),
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
    );
    assert!(t.finish().is_empty());
}

#[test]
fn thinking_then_text_then_tools() {
    let mut t = StreamTranslator::new("m", "msg_2");
    let call = |index: u64, id: Option<&str>, name: Option<&str>, args: &str| json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": args}}]});
    let events = run(
        &mut t,
        &[
            chunk(json!({"reasoning_content": "Think"}), None),
            chunk(json!({"reasoning_content": "ing."}), None),
            chunk(json!({"content": "Calling."}), None),
            chunk(call(0, Some("call_a"), Some("get_weather"), ""), None),
            chunk(call(0, None, None, "{\"city\": "), None),
            chunk(call(0, None, None, "\"Paris\"}"), None),
            chunk(call(1, Some("call_b"), Some("get_time"), "{}"), None),
            chunk(json!({}), Some("tool_calls")),
            usage_chunk(20, 30),
        ],
    );
    let starts: Vec<(u64, Value)> = events
        .iter()
        .filter(|e| e.name == "content_block_start")
        .map(|e| {
            (
                e.data["index"].as_u64().unwrap(),
                e.data["content_block"].clone(),
            )
        })
        .collect();
    assert_eq!(
        starts,
        vec![
            (
                0,
                json!({"type": "thinking", "thinking": "", "signature": ""})
            ),
            (1, json!({"type": "text", "text": ""})),
            (
                2,
                json!({"type": "tool_use", "id": "call_a", "name": "get_weather", "input": {}})
            ),
            (
                3,
                json!({"type": "tool_use", "id": "call_b", "name": "get_time", "input": {}})
            ),
        ]
    );
    let stops: Vec<u64> = events
        .iter()
        .filter(|e| e.name == "content_block_stop")
        .map(|e| e.data["index"].as_u64().unwrap())
        .collect();
    assert_eq!(stops, [0, 1, 2, 3]);
    let json_deltas: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e.data["delta"]["type"] == "input_json_delta")
        .map(|e| {
            (
                e.data["index"].as_u64().unwrap(),
                e.data["delta"]["partial_json"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        json_deltas,
        vec![
            (2, "{\"city\": ".into()),
            (2, "\"Paris\"}".into()),
            (3, "{}".into())
        ]
    );
    assert_eq!(
        events[3].data["delta"],
        json!({"type": "thinking_delta", "thinking": "ing."})
    );
    let delta = events.iter().find(|e| e.name == "message_delta").unwrap();
    assert_eq!(delta.data["delta"]["stop_reason"], "tool_use");
    assert_eq!(
        delta.data["usage"],
        json!({"input_tokens": 20, "output_tokens": 30})
    );
    assert_eq!(events.last().unwrap().name, "message_stop");
}

#[test]
fn usage_in_the_first_and_last_chunk() {
    // vLLM with continuous usage: the first chunk's prompt count wins over the gateway's.
    let mut t = StreamTranslator::new("m", "msg_3").with_input_tokens(1);
    let mut first = chunk(json!({"content": "a"}), None);
    first["usage"] = json!({"prompt_tokens": 7, "completion_tokens": 1});
    let mut last = chunk(json!({}), Some("stop"));
    last["usage"] = json!({"prompt_tokens": 7, "completion_tokens": 3});
    let events = run(&mut t, &[first, last]);
    assert_eq!(events[0].data["message"]["usage"]["input_tokens"], 7);
    let delta = events.iter().find(|e| e.name == "message_delta").unwrap();
    assert_eq!(delta.data["usage"]["output_tokens"], 3);
}

#[test]
fn stop_sequence_stop() {
    let mut t = StreamTranslator::new("m", "msg_4").with_stop_sequences(vec!["###".into()]);
    let mut end = chunk(json!({}), Some("stop"));
    end["choices"][0]["matched_stop"] = json!("###");
    let events = run(
        &mut t,
        &[chunk(json!({"content": "x"}), None), end, usage_chunk(1, 1)],
    );
    let delta = events.iter().find(|e| e.name == "message_delta").unwrap();
    assert_eq!(
        delta.data["delta"],
        json!({"stop_reason": "stop_sequence", "stop_sequence": "###"})
    );
}

#[test]
fn error_chunk_ends_the_stream() {
    let mut t = StreamTranslator::new("m", "msg_5");
    let mut events = t.on_chunk(&chunk(json!({"content": "x"}), None)).unwrap();
    events.extend(t.on_chunk(&json!({"error": {"message": "out of memory", "type": "InternalServerError", "code": 503}})).unwrap());
    assert_eq!(
        events.last().unwrap(),
        &error_event("overloaded_error", "out of memory")
    );
    assert_eq!(
        events.last().unwrap().to_sse(),
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"out of memory\"}}\n\n"
    );
    assert!(t
        .on_chunk(&chunk(json!({"content": "y"}), None))
        .unwrap()
        .is_empty());
    assert!(t.finish().is_empty());
}

#[test]
fn truncated_or_malformed_streams_fail() {
    // No finish reason before [DONE]: an error, not message_stop.
    let mut t = StreamTranslator::new("m", "msg_6");
    let events = run(&mut t, &[chunk(json!({"content": "x"}), None)]);
    assert_eq!(events.last().unwrap().name, "error");
    assert!(!names(&events).contains(&"message_stop"));
    // No usage: an error too.
    let mut t = StreamTranslator::new("m", "msg_7");
    let events = run(&mut t, &[chunk(json!({"content": "x"}), Some("stop"))]);
    assert_eq!(events.last().unwrap().name, "error");
    // A tool call without id and name, and one resumed after its block closed.
    let mut t = StreamTranslator::new("m", "msg_8");
    assert!(t
        .on_chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            None
        ))
        .is_err());
    let mut t = StreamTranslator::new("m", "msg_9");
    t.on_chunk(&chunk(json!({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": ""}}]}), None)).unwrap();
    t.on_chunk(&chunk(json!({"content": "text"}), None))
        .unwrap();
    assert!(t
        .on_chunk(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}),
            None
        ))
        .is_err());
}
