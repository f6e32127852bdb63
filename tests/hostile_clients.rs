//! Hostile clients cannot get around the gateway: engine-control fields and request ids stay
//! the gateway's, every client-side wait has a deadline, oversized headers are refused, load
//! has a ceiling, and the admin and catalog routes say no more than they should.

mod support;

use serde_json::json;
use std::time::Duration;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

/// The standard config with extra `[server]` and `[upstream]` keys.
fn config(pools: &str, server: &str, upstream: &str) -> String {
    config_with_pools(WINDOW, pools)
        .replace(
            "drain_timeout = \"10s\"",
            &format!("drain_timeout = \"10s\"\n{server}"),
        )
        .replace(
            "request_timeout = \"20s\"",
            &format!("request_timeout = \"20s\"\n{upstream}"),
        )
}

/// Bytes the gateway sends back on a raw connection until it closes it (bounded wait: a
/// gateway that never closes fails the test instead of hanging it).
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the gateway kept the connection open");
    String::from_utf8_lossy(&out).into_owned()
}

/// Ask `url` for a one-token generation until it answers `status` (a few hundred ms at
/// most): slots and reservations change hands asynchronously.
async fn eventually(url: &str, status: u16) -> Option<Reply> {
    // Up to ~10 s: a clean-clone CI run on a loaded machine once saw the buffer budget
    // not fill within 5 s.
    for _ in 0..500 {
        let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}});
        let reply = post(url, Some(KEY), &body).await;
        if reply.status == status {
            return Some(reply);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn engine_control_fields_are_refused_and_the_engine_gets_the_gateways_ids() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    for (field, value) in [
        ("rid", json!("victim-request")),
        ("session_params", json!({"id": "s"})),
        ("custom_logit_processor", json!("x")),
        ("return_hidden_states", json!(true)),
        ("bootstrap_room", json!(7)),
        ("data_parallel_rank", json!(0)),
        ("input_embeds", json!([[0.1]])),
    ] {
        let mut body = json!({"text": "hello", "sampling_params": {"max_new_tokens": 2}});
        body[field] = value;
        let reply = post(&url, Some(KEY), &body).await;
        assert_eq!(reply.status, 400, "{field}: {}", reply.text());
        assert_eq!(error_code(&reply), "unsupported_parameter");
        assert_eq!(reply.json()["error"]["param"], field);
    }
    let nested =
        json!({"text": "hi", "sampling_params": {"max_new_tokens": 2, "custom_params": {}}});
    let reply = post(&url, Some(KEY), &nested).await;
    assert_eq!(
        reply.json()["error"]["param"],
        "sampling_params.custom_params"
    );
    assert!(
        generations(&engine).is_empty(),
        "nothing refused reached the engine"
    );

    // The client's x-request-id is echoed, never the engine's id.
    let mut req = request(
        http::Method::POST,
        &url,
        Some(KEY),
        json!({"text": "hello", "sampling_params": {"max_new_tokens": 2}}).to_string(),
    );
    req.headers_mut()
        .insert("x-request-id", "victim-request".parse().unwrap());
    let reply = read(send(req).await).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.headers["x-client-request-id"], "victim-request");
    let ours = reply.headers["x-request-id"].to_str().unwrap().to_owned();
    assert_ne!(ours, "victim-request");
    assert_eq!(reply.json()["meta_info"]["id"], ours.as_str());
    let received = generations(&engine);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body["rid"], ours.as_str());
    // The client's id is kept for the logs: the request's audit line carries both.
    let line = gw
        .audit()
        .recent()
        .into_iter()
        .find(|l| l["request_id"] == ours.as_str())
        .expect("an audit line for the request");
    assert_eq!(line["client_request_id"], "victim-request");
    gw.shutdown().await;
}

#[tokio::test]
async fn lora_adapters_only_by_name_from_the_tenants_list() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let text = config(&unified_pool("u", &[worker(&engine, None)]), "", "").replace(
        "name = \"t1\"",
        "name = \"t1\"\nlora_adapters = [\"sql-v2\"]",
    );
    let gw = gateway(&text).await;
    let url = format!("http://{}/v1/completions", gw.data_addr());
    let ask = |lora: serde_json::Value| json!({"model": "qwen3", "prompt": "hi", "max_tokens": 2, "lora_path": lora});
    let ok = post(&url, Some(KEY), &ask(json!("sql-v2"))).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let other = post(&url, Some(KEY), &ask(json!("someone-elses"))).await;
    assert_eq!(
        (other.status.as_u16(), error_code(&other).as_str()),
        (403, "lora_not_allowed")
    );
    let path = post(&url, Some(KEY), &ask(json!("/models/evil-weights"))).await;
    assert_eq!(path.status, 400, "{}", path.text());
    let received = generations(&engine);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body["lora_path"], "sql-v2");
    gw.shutdown().await;
}

#[tokio::test]
async fn slow_and_half_sent_requests_hit_deadlines() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "header_read_timeout = \"1s\"\nbody_idle_timeout = \"1s\"\nbody_timeout = \"3s\"",
        "",
    ))
    .await;
    let addr = gw.data_addr();

    // Half a header: closed (hyper answers 408 or just closes).
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"POST /generate HTTP/1.1\r\nHost: x\r\nAuthor")
        .await
        .unwrap();
    let answer = until_closed(&mut half).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer}"
    );

    // Nothing at all after connecting, and nothing after a response: both closed.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    until_closed(&mut idle).await;

    // Nothing after a complete exchange: the keep-alive connection is closed too.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    let body = r#"{"text": "hi", "sampling_params": {"max_new_tokens": 1}}"#;
    let exchange = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    kept.write_all(exchange.as_bytes()).await.unwrap();
    let answer = until_closed(&mut kept).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Headers and 17 bytes of a 100 KB body: 408 with the JSON error.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{\"text\": \"abcdef"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let answer = until_closed(&mut slow).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");

    // A body that trickles in (a byte before each idle deadline) still ends at the total.
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    trickle.write_all(head.as_bytes()).await.unwrap();
    let feeder = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            if trickle.write_all(b"a").await.is_err() {
                break;
            }
        }
        let mut out = Vec::new();
        let _ = trickle.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    let answer = tokio::time::timeout(Duration::from_secs(30), feeder)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.contains("server.body_timeout"), "{answer}");
    assert_eq!(
        generations(&engine).len(),
        1,
        "only the complete request reached the engine"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn oversized_headers_are_431() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    let body = json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}}).to_string();
    // One 20 KiB value (over the 16 KiB per-value limit).
    let mut req = request(http::Method::POST, &url, Some(KEY), body.clone());
    req.headers_mut()
        .insert("x-big", "a".repeat(20 * 1024).parse().unwrap());
    let reply = read(send(req).await).await;
    assert_eq!(reply.status, 431, "{}", reply.text());
    assert_eq!(error_code(&reply), "request_header_too_large");
    // 100 KB of headers in small values: refused while reading (over the 64 KiB block).
    let mut raw = TcpStream::connect(gw.data_addr()).await.unwrap();
    let mut head = String::from("POST /generate HTTP/1.1\r\nHost: x\r\n");
    for i in 0..100 {
        head.push_str(&format!("x-h{i}: {}\r\n", "b".repeat(1000)));
    }
    head.push_str("\r\n");
    let _ = raw.write_all(head.as_bytes()).await;
    let answer = until_closed(&mut raw).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert!(generations(&engine).is_empty());
    gw.shutdown().await;
}

#[tokio::test]
async fn in_flight_ceilings_answer_503_at_once_and_free_with_the_stream() {
    let engine = slow_engine(WINDOW as usize, 100).await;
    for (server, pool_extra, ceiling) in [
        ("max_in_flight = 1", "", "in-flight request"),
        ("", "max_in_flight = 1\n", "pool in-flight request"),
    ] {
        let pools = unified_pool("u", &[worker(&engine, None)]) + pool_extra;
        let gw = gateway(&config(&pools, server, "")).await;
        let url = format!("http://{}/generate", gw.data_addr());
        // The simulated engine echoes the prompt: a long one keeps the stream open.
        let long = json!({"text": "a long story ".repeat(50), "stream": true, "sampling_params": {"max_new_tokens": 50}});
        let held = send(request(
            http::Method::POST,
            &url,
            Some(KEY),
            long.to_string(),
        ))
        .await;
        assert_eq!(held.status(), 200);
        let refused = post(&url, Some(KEY), &json!({"text": "hi"})).await;
        assert_eq!(refused.status, 503, "{ceiling}: {}", refused.text());
        assert_eq!(error_code(&refused), "overloaded");
        assert_eq!(refused.headers["retry-after"], "1");
        assert!(refused.text().contains(ceiling), "{}", refused.text());
        drop(held); // the client goes away: its slot is free again
        let ok = eventually(&url, 200).await;
        assert!(ok.is_some(), "the slot came back");
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn buffered_bodies_share_one_memory_budget() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "max_body_bytes = \"4KiB\"\nmax_buffered_bytes = \"8KiB\"\nbody_idle_timeout = \"10s\"",
        "max_response_bytes = \"4KiB\"",
    ))
    .await;
    // Two unfinished 4 KiB bodies hold the whole budget.
    let head = format!(
        "POST /generate HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 4096\r\n\r\n{{"
    );
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.data_addr()).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        holders.push(s);
    }
    // Their reservations land as their heads are read. Wait for both before asking: a
    // probe that arrived first would hold a unit and leave the second holder refused.
    for _ in 0..1000 {
        if gw.buffered_bytes() >= 8 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        gw.buffered_bytes(),
        8 * 1024,
        "both holders hold their 4 KiB"
    );
    let url = format!("http://{}/generate", gw.data_addr());
    let refused = post(&url, Some(KEY), &json!({"text": "hi"})).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(error_code(&refused), "overloaded");
    assert!(
        refused.text().contains("buffered request bytes"),
        "{}",
        refused.text()
    );
    drop(holders);
    let ok = eventually(&url, 200).await;
    assert!(ok.is_some(), "the budget came back when the clients left");
    gw.shutdown().await;
}

#[tokio::test]
async fn models_are_listed_per_tenant_and_health_is_503_while_draining() {
    let engine = slow_engine(WINDOW as usize, 50).await;
    let text = config(&unified_pool("u", &[worker(&engine, None)]), "", "")
        .replace(
            "[[tenants]]",
            &format!(
                "[[models]]\nname = \"other\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\ncontext_window = 1000\n\n{}\n[[tenants]]",
                unified_pool("o", &[worker(&engine, None)]).replace("model = \"qwen3\"", "model = \"other\"")
            ),
        )
        .replace("name = \"t1\"", "name = \"t1\"\nmodels = [\"qwen3\"]");
    let gw = gateway(&text).await;
    let models = get(&format!("http://{}/v1/models", gw.data_addr()), Some(KEY)).await;
    let ids: Vec<String> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["qwen3"], "only the tenant's models");

    // Mutating admin routes are off without a configured admin token.
    let reload = read(
        send(request(
            http::Method::POST,
            &format!("http://{}/reload", gw.admin_addr()),
            None,
            "",
        ))
        .await,
    )
    .await;
    assert_eq!(reload.status, 403, "{}", reload.text());

    // A stream in flight keeps the data port draining; /health says so.
    let url = format!("http://{}/generate", gw.data_addr());
    let held = send(request(
        http::Method::POST,
        &url,
        Some(KEY),
        json!({"model": "qwen3", "text": "a long story ".repeat(50), "stream": true,
               "sampling_params": {"max_new_tokens": 20}})
        .to_string(),
    ))
    .await;
    assert_eq!(held.status(), 200);
    gw.begin_shutdown();
    let health = get(&format!("http://{}/health", gw.admin_addr()), None).await;
    assert_eq!(health.status, 503, "{}", health.text());
    assert_eq!(health.json()["status"], "draining");
    let rest = read(held).await;
    assert!(
        rest.text().contains("[DONE]"),
        "the stream finished: {}",
        rest.text()
    );
    gw.wait().await;
}

#[tokio::test]
async fn connections_over_the_cap_wait_for_a_free_one() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        // Four data threads accept on the port: the cap is one over all of them.
        "max_connections = 1\ndata_threads = 4\nheader_read_timeout = \"2s\"",
        "",
    ))
    .await;
    // One silent connection takes the only slot until its header deadline closes it.
    let mut silent = TcpStream::connect(gw.data_addr()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // let the gateway accept it first
    let url = format!("http://{}/generate", gw.data_addr());
    let waiting = tokio::spawn(async move {
        let reply = post(
            &url,
            Some(KEY),
            &json!({"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
        )
        .await;
        (reply.status, std::time::Instant::now())
    });
    until_closed(&mut silent).await;
    let freed = std::time::Instant::now();
    let (status, served) = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200);
    assert!(served >= freed, "served only once the slot was free");
    gw.shutdown().await;
}

/// POST `body` exactly as written (not re-serialised from a value).
async fn post_raw(url: &str, body: &str) -> Reply {
    read(
        send(request(
            http::Method::POST,
            url,
            Some(KEY),
            body.to_string(),
        ))
        .await,
    )
    .await
}

#[tokio::test]
async fn a_field_sent_twice_is_refused_and_the_prompt_reaches_the_engine_as_sent() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let gw = gateway(&config(
        &unified_pool("u", &[worker(&engine, None)]),
        "",
        "",
    ))
    .await;
    let url = format!("http://{}/generate", gw.data_addr());
    // Two prompts in one body: the gateway would count one and an engine might run the
    // other, so neither is sent anywhere.
    for body in [
        r#"{"text":"short","text":"a much longer prompt","sampling_params":{"max_new_tokens":2}}"#,
        r#"{"text":"a","sampling_params":{"max_new_tokens":2},"sampling_params":{"max_new_tokens":9000}}"#,
    ] {
        let reply = post_raw(&url, body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        assert!(reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("more than once"));
    }
    assert!(
        generations(&engine).is_empty(),
        "nothing refused reached the engine"
    );

    // Escapes and spacing in the prompt are passed on as the client wrote them: the engine
    // decodes the same text the gateway counted.
    let body = r#"{"text" : "caf\u00e9 \"quoted\"\n",  "sampling_params":{"max_new_tokens":2}}"#;
    let reply = post_raw(&url, body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let received = generations(&engine);
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body["text"], "café \"quoted\"\n");
    assert_eq!(received[0].body["sampling_params"]["max_new_tokens"], 2);
    gw.shutdown().await;
}

/// A body sent to a route that does not exist is not read: the 404 names the routes kvgate
/// serves and says the connection closes, so a keep-alive client's next request goes on a
/// new connection and succeeds (before, it failed with "Server disconnected").
#[tokio::test]
async fn an_unknown_route_with_a_body_answers_404_and_leaves_the_client_usable() {
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool(
            "u",
            &["{ url = \"http://127.0.0.1:9\", kv_tokens = 40960 }".to_owned()],
        ),
    ))
    .await;
    let body = "x".repeat(70 * 1024);
    let mut raw = TcpStream::connect(gw.data_addr()).await.unwrap();
    raw.write_all(
        format!(
            "POST /v1/no_such_route HTTP/1.1\r\nhost: kvgate\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let answer = until_closed(&mut raw).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 404"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(
        answer.contains("post /v1/chat/completions"),
        "the 404 names the routes: {answer}"
    );
    // Through a pooled keep-alive client: the 404, then the next request on the same client.
    let base = format!("http://{}", gw.data_addr());
    let reply = post(
        &format!("{base}/v1/no_such_route"),
        Some(KEY),
        &json!({"pad": body}),
    )
    .await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.headers["connection"], "close");
    let models = get(&format!("{base}/v1/models"), Some(KEY)).await;
    assert_eq!(models.status, 200, "{}", models.text());
    // A bodiless request to an unknown route keeps its connection.
    let plain = get(&format!("{base}/v1/nothing"), Some(KEY)).await;
    assert_eq!(plain.status, 404);
    assert!(plain.headers.get("connection").is_none());
}
