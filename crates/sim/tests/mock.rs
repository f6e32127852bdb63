//! The mock engine (`kvgate mock-engine`): answer kinds chosen by a marker, and its pace.

mod support;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn mock(config: SimConfig) -> kvgate_sim::RunningMock {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    kvgate_sim::spawn_mock_with(config, Arc::clone(&QWEN3), listener).unwrap()
}

fn chat(kind: &str, stream: bool) -> (Value, usize) {
    let messages = json!([{"role": "user", "content": format!("[answer:{kind}] Tell me.")}]);
    let rendered = QWEN3.apply_chat_template(&messages, None, true).unwrap();
    let prompt = QWEN3.count_rendered_chat(&rendered).unwrap();
    let body = json!({"model": "qwen3", "max_tokens": 48, "stream": stream,
        "stream_options": {"include_usage": true}, "messages": messages});
    (body, prompt)
}

fn content(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

#[tokio::test]
async fn each_answer_kind_streams_its_own_text_and_passes_the_gateway_checks() {
    let mock = mock(SimConfig {
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await;
    let mut texts = Vec::new();
    for kind in ["prose", "code", "digits", "cjk", "unknown"] {
        let (body, prompt) = chat(kind, true);
        let (status, events) = post_sse(mock.http_addr, "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{kind}");
        assert_eq!(events.last(), Some(&json!("[DONE]")), "{kind}");
        let finish: Vec<_> = events
            .iter()
            .filter_map(|e| e["choices"][0]["finish_reason"].as_str())
            .collect();
        assert_eq!(finish, ["length"], "{kind}");
        let usage = events
            .iter()
            .rev()
            .find(|e| e["usage"].is_object())
            .unwrap();
        assert_eq!(usage["usage"]["prompt_tokens"], json!(prompt), "{kind}");
        assert_eq!(usage["usage"]["completion_tokens"], json!(48), "{kind}");
        let streamed = content(&events);
        // The same body unstreamed answers the same text.
        let (plain, _) = chat(kind, false);
        let (status, full) = post(mock.http_addr, "/v1/chat/completions", &plain).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(full["choices"][0]["message"]["content"], json!(streamed));
        texts.push(streamed);
    }
    let [prose, code, digits, cjk, unknown] = texts.try_into().unwrap();
    assert!(prose.starts_with("Pages of KV are admitted"), "{prose}");
    assert_eq!(unknown, prose, "an unknown kind is prose");
    assert!(code.contains("fn admit(pool: &mut Pool"), "{code}");
    let digit_count = digits.chars().filter(char::is_ascii_digit).count();
    assert!(digit_count >= 20, "digit-heavy: {digits}");
    let cjk_count = cjk.chars().filter(|c| !c.is_ascii()).count();
    assert!(cjk_count >= 30, "CJK: {cjk}");
    mock.shutdown().await;
}

/// Reads from `stream` until `buf` holds `count` occurrences of `needle`.
async fn read_until(
    stream: &mut tokio::net::TcpStream,
    buf: &mut String,
    needle: &str,
    count: usize,
) {
    let mut chunk = [0u8; 4096];
    while buf.matches(needle).count() < count {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the stream ended early: {buf}");
        buf.push_str(std::str::from_utf8(&chunk[..n]).unwrap());
    }
}

#[tokio::test]
async fn a_paced_mock_sends_one_token_event_at_a_time() {
    // The first token comes at once, every later one an hour after the one before: what the
    // client holds after the first content event is all the engine has sent.
    let mock = mock(SimConfig {
        model: "qwen3".into(),
        token_latency: Duration::from_secs(3600),
        first_token_latency: Duration::from_millis(1),
        ..SimConfig::default()
    })
    .await;
    let (body, _) = chat("digits", true);
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(mock.http_addr)
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body.as_bytes()).await.unwrap();
    let mut got = String::new();
    // The role event, then the first token event.
    read_until(&mut stream, &mut got, "data: ", 2).await;
    read_until(&mut stream, &mut got, "\n\n", 2).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(got.contains(r#""role":"assistant""#), "{got}");
    assert!(!got.contains("[DONE]"), "{got}");
    let stats = mock.stats();
    assert_eq!(stats.streams_started, 1);
    assert_eq!(stats.token_events_sent, 1);
    drop(stream);
    mock.shutdown().await;
}

#[tokio::test]
async fn an_unpaced_mock_counts_nothing_and_a_paced_one_sends_the_same_events() {
    let unpaced = mock(SimConfig {
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await;
    let paced = mock(SimConfig {
        model: "qwen3".into(),
        token_latency: Duration::from_millis(1),
        ..SimConfig::default()
    })
    .await;
    let (body, _) = chat("cjk", true);
    let (_, at_once) = post_sse(unpaced.http_addr, "/v1/chat/completions", &body).await;
    let (_, one_by_one) = post_sse(paced.http_addr, "/v1/chat/completions", &body).await;
    assert_eq!(at_once.len(), one_by_one.len());
    assert_eq!(content(&at_once), content(&one_by_one));
    assert_eq!(unpaced.stats().token_events_sent, 0);
    let tokens = one_by_one
        .iter()
        .filter(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
        })
        .count();
    assert_eq!(paced.stats().token_events_sent, tokens as u64);
    assert_eq!(paced.stats().streams_completed, 1);
    unpaced.shutdown().await;
    paced.shutdown().await;
}
