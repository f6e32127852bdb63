//! The response guard end to end (I1): no abort, placeholder or foreign data reaches a client
//! as a success — proven by replaying the incident and by one test per engine fault.

mod support;

use serde_json::{json, Value};
use support::*;

use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};

const WINDOW: u64 = 1_048_576;
/// Small pools keep the replay fast: max_req_input_len = min(W-1, 2047) - 5 = 2042.
const POOL: usize = 2048;
const SECRET: &str = "ZEBRA-4471-QUOKKA";

fn sim(role: SimRole, fault: SimFault, kv: usize, server_info: bool) -> SimConfig {
    SimConfig {
        role,
        fault,
        kv_tokens: kv,
        context_length: WINDOW as usize,
        model: "qwen3".into(),
        server_info,
        ..SimConfig::default()
    }
}

fn words(n: usize) -> String {
    "lorem ".repeat(n)
}

/// The request of a client, for `/generate` or chat.
fn ask(chat: bool, prompt: &str, stream: bool, max_new: u64) -> (&'static str, Value) {
    if chat {
        (
            "/v1/chat/completions",
            // Thinking off: the simulated engine answers with the end of the prompt at once.
            json!({"model": "qwen3", "stream": stream, "max_tokens": max_new,
                   "chat_template_kwargs": {"enable_thinking": false},
                   "messages": [{"role": "user", "content": prompt}]}),
        )
    } else {
        (
            "/generate",
            json!({"text": prompt, "stream": stream, "sampling_params": {"max_new_tokens": max_new}}),
        )
    }
}

/// A client's view of an answer: it succeeded only with a 2xx that ends like a success.
fn succeeded(reply: &Reply, stream: bool) -> bool {
    if !reply.status.is_success() {
        return false;
    }
    if !stream {
        return true;
    }
    let data = reply.sse_data();
    data.last().map(String::as_str) == Some("[DONE]")
        && !data.iter().any(|d| d.contains("\"error\""))
}

struct Replay {
    prefill: RunningSim,
    decode: RunningSim,
    gw: kvgate::runtime::RunningGateway,
}

/// PD engines with the incident's bug. `defeated`: the gateway is told a prefill pool far
/// larger than the engine's and cannot discover the real one (the incident's mismatch).
async fn replay_setup(defeated: bool) -> Replay {
    let prefill = engine_with(sim(SimRole::Prefill, SimFault::Incident, POOL, !defeated)).await;
    let decode = engine_with(sim(SimRole::Decode, SimFault::Incident, 1_048_576, true)).await;
    let told = if defeated { Some(1_048_576) } else { None };
    let pools = pd_pool("pd", &[worker(&prefill, told)], &[worker(&decode, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    Replay {
        prefill,
        decode,
        gw,
    }
}

async fn replay(chat: bool, stream: bool, defeated: bool) {
    let r = replay_setup(defeated).await;
    let base = format!("http://{}", r.gw.data_addr());
    // Client A: a long prompt that ends with a secret; served normally.
    let (path, body) = ask(
        chat,
        &format!("{} The secret code is {SECRET}.", words(1200)),
        stream,
        16,
    );
    let a = post(&format!("{base}{path}"), Some(KEY), &body).await;
    assert!(succeeded(&a, stream), "client A: {}", a.text());
    // Client B: a prompt over the prefill pool.
    let (path, body) = ask(chat, &words(3000), stream, 64);
    let b = post(&format!("{base}{path}"), Some(KEY), &body).await;
    let text = b.text();
    assert!(
        !succeeded(&b, stream),
        "client B must not succeed: {} {text}",
        b.status
    );
    // The gateway's random request id is no part of the answer (it may hold "4471").
    let answer = without_request_ids(&text);
    for fragment in [SECRET, "ZEBRA", "4471", "QUOKKA"] {
        assert!(
            !answer.contains(fragment),
            "client B saw the secret: {text}"
        );
    }
    if defeated {
        // The guard alone stopped it: the request did reach the engines.
        assert_eq!(generations(&r.prefill).len(), 2);
        assert!(b.status == 502 || b.status == 400, "{} {text}", b.status);
        let trips: Vec<Value> =
            r.gw.audit()
                .recent()
                .into_iter()
                .filter(|l| l["event"] == "guard_trip")
                .collect();
        assert_eq!(trips.len(), 1, "{trips:?}");
        assert_eq!(trips[0]["tenant"], "t1");
        assert!(
            !trips[0].to_string().contains("lorem"),
            "audit lines carry no prompt text"
        );
    } else {
        assert_eq!(b.status, 400, "{text}");
        assert_eq!(error_code(&b), "context_length_exceeded");
        assert_eq!(
            generations(&r.prefill).len(),
            1,
            "B never reached the prefill engine"
        );
        assert_eq!(
            generations(&r.decode).len(),
            1,
            "B never reached the decode engine"
        );
    }
    r.gw.shutdown().await;
}

#[tokio::test]
async fn incident_replay_generate_admission_correct() {
    replay(false, false, false).await;
    replay(false, true, false).await;
}

#[tokio::test]
async fn incident_replay_generate_admission_defeated_guard_stops_it() {
    replay(false, false, true).await;
    replay(false, true, true).await;
}

#[tokio::test]
async fn incident_replay_chat_admission_correct() {
    replay(true, false, false).await;
    replay(true, true, false).await;
}

#[tokio::test]
async fn incident_replay_chat_admission_defeated_guard_stops_it() {
    replay(true, false, true).await;
    replay(true, true, true).await;
}

#[tokio::test]
async fn a_unified_incident_engine_is_caught_by_the_prompt_count_on_the_first_event() {
    let engine = engine_with(sim(SimRole::Unified, SimFault::Incident, POOL, false)).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, Some(1_048_576))]),
    ))
    .await;
    let base = format!("http://{}", gw.data_addr());
    for chat in [false, true] {
        let (path, body) = ask(
            chat,
            &format!("{} The secret code is {SECRET}.", words(1200)),
            false,
            16,
        );
        assert_eq!(
            post(&format!("{base}{path}"), Some(KEY), &body)
                .await
                .status,
            200
        );
        for stream in [false, true] {
            let (path, body) = ask(chat, &words(3000), stream, 64);
            let b = post(&format!("{base}{path}"), Some(KEY), &body).await;
            assert_eq!(b.status, 502, "chat={chat} stream={stream}: {}", b.text());
            assert_eq!(error_code(&b), "upstream_integrity_error");
            assert!(!b.text().contains("QUOKKA"));
        }
    }
    gw.shutdown().await;
}

async fn unified_with(
    fault: SimFault,
    guard: &str,
) -> (RunningSim, kvgate::runtime::RunningGateway) {
    let engine = engine_with(sim(SimRole::Unified, fault, 40960, true)).await;
    let pools = format!("{}{guard}", unified_pool("u", &[worker(&engine, None)]));
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    (engine, gw)
}

/// Non-streaming: the error status and code; streaming: the same when the first event
/// trips, else a 200 whose stream ends in an error event without `[DONE]`.
async fn expect_refused(
    gw: &kvgate::runtime::RunningGateway,
    chat: bool,
    prompt: &str,
    status: u16,
    code: &str,
) {
    let base = format!("http://{}", gw.data_addr());
    let (path, body) = ask(chat, prompt, false, 16);
    let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (status, code),
        "{}",
        reply.text()
    );
    let (path, body) = ask(chat, prompt, true, 16);
    let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
    if reply.status.is_success() {
        let data = reply.sse_data();
        assert!(
            !data.iter().any(|d| d == "[DONE]"),
            "no [DONE] after a trip: {data:?}"
        );
        let last: Value =
            serde_json::from_str(data.last().expect("an event")).expect("JSON error event");
        assert_eq!(last["error"]["code"], code, "{data:?}");
        assert!(
            !data.iter().any(
                |d| d.contains("\"finish_reason\":\"stop\"") || d.contains("\"type\":\"stop\"")
            ),
            "no synthetic success finish: {data:?}"
        );
    } else {
        assert_eq!(
            (reply.status.as_u16(), error_code(&reply).as_str()),
            (status, code),
            "{}",
            reply.text()
        );
    }
}

#[tokio::test]
async fn an_abort_with_a_status_keeps_it_and_tells_the_client_no_engine_internals() {
    // A fixed engine refusing an over-long prompt that the gateway was told fits.
    let engine = engine_with(sim(SimRole::Unified, SimFault::None, 256, false)).await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, Some(40960))]),
    ))
    .await;
    let base = format!("http://{}", gw.data_addr());
    for stream in [false, true] {
        let (path, body) = ask(false, &words(400), stream, 8);
        let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
        assert_eq!(reply.status, 400, "stream={stream}: {}", reply.text());
        // The engine's own words go to the log; the client gets the code and the id.
        assert!(
            !reply.text().contains("exceeds the maximum allowed length")
                && !reply.text().contains(&engine.http_addr.to_string()),
            "{}",
            reply.text()
        );
        assert!(reply.json()["error"]["request_id"].is_string());
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn an_abort_without_a_status_is_502_upstream_aborted() {
    let (_e, gw) = unified_with(SimFault::AbortNoStatus, "").await;
    for chat in [false, true] {
        expect_refused(&gw, chat, "hello there", 502, "upstream_aborted").await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn an_abort_mid_stream_becomes_an_error_event_without_done() {
    let (_e, gw) = unified_with(SimFault::AbortMidStream, "").await;
    for chat in [false, true] {
        expect_refused(&gw, chat, &words(20), 502, "upstream_aborted").await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn an_error_event_inside_a_200_stream_is_not_a_success() {
    let (_e, gw) = unified_with(SimFault::ErrorEvent, "").await;
    let base = format!("http://{}", gw.data_addr());
    for chat in [false, true] {
        let (path, body) = ask(chat, &words(20), true, 8);
        let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
        assert!(!succeeded(&reply, true), "{}", reply.text());
        let data = reply.sse_data();
        assert!(!data.iter().any(|d| d == "[DONE]"), "{data:?}");
        // Non-streaming, the engine answers 500: a 502 to the client.
        let (path, body) = ask(chat, &words(20), false, 8);
        assert_eq!(
            post(&format!("{base}{path}"), Some(KEY), &body)
                .await
                .status,
            502
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_stream_cut_midway_ends_in_an_error_event() {
    let (_e, gw) = unified_with(SimFault::CutStream, "").await;
    let base = format!("http://{}", gw.data_addr());
    for chat in [false, true] {
        let (path, body) = ask(chat, &words(20), true, 16);
        let reply = post(&format!("{base}{path}"), Some(KEY), &body).await;
        let data = reply.sse_data();
        assert!(!data.iter().any(|d| d == "[DONE]"), "{data:?}");
        let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
        assert_eq!(
            last["error"]["code"], "upstream_integrity_error",
            "{data:?}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_wrong_prompt_count_is_an_integrity_error() {
    let (_e, gw) = unified_with(SimFault::WrongPromptTokens, "").await;
    for chat in [false, true] {
        expect_refused(&gw, chat, &words(50), 502, "upstream_integrity_error").await;
    }
    let trips = gw
        .audit()
        .recent()
        .into_iter()
        .filter(|l| l["reason"] == "prompt_tokens_mismatch")
        .count();
    assert!(trips >= 2);
    let metrics = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    // The series exists at zero from start-up (issue 40): its value, not its presence, says
    // the trips were counted.
    assert!(
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(
                "kvgate_guard_trips_total{reason=\"prompt_tokens_mismatch\",pool=\"u\"} "
            ))
            .any(|v| v.trim().parse::<f64>().is_ok_and(|n| n >= 2.0)),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn an_abort_on_the_prefill_leg_only_fails_the_request() {
    let prefill = engine_with(sim(SimRole::Prefill, SimFault::PrefillAbort, 40960, true)).await;
    let decode = engine_with(sim(SimRole::Decode, SimFault::None, 40960, true)).await;
    let pools = pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    for chat in [false, true] {
        expect_refused(&gw, chat, "hello prefill", 502, "upstream_aborted").await;
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn placeholder_markers_stop_the_answer() {
    let guard = "[pools.guard]\nmarkers = [\"PLACEHOLDER-7\"]\nmarker_patterns = [\"(?i)request was dropped\"]\n";
    let (_e, gw) = unified_with(SimFault::None, guard).await;
    // The simulated engine echoes the prompt's tail, so a marker there shows in the output.
    for chat in [false, true] {
        expect_refused(
            &gw,
            chat,
            &format!("{} PLACEHOLDER-7", words(30)),
            502,
            "upstream_integrity_error",
        )
        .await;
        expect_refused(
            &gw,
            chat,
            &format!("{} The Request Was Dropped", words(30)),
            502,
            "upstream_integrity_error",
        )
        .await;
    }
    // Text without a marker passes.
    let base = format!("http://{}", gw.data_addr());
    let (path, body) = ask(true, "an ordinary question", true, 8);
    assert!(succeeded(
        &post(&format!("{base}{path}"), Some(KEY), &body).await,
        true
    ));
    gw.shutdown().await;
}

#[tokio::test]
async fn usage_asked_for_the_check_is_stripped_unless_the_client_asked() {
    let (engine, gw) = unified_with(SimFault::None, "").await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let mut body = json!({"model": "qwen3", "stream": true, "max_tokens": 6, "messages": [{"role": "user", "content": "count my tokens"}]});
    let plain = post(&url, Some(KEY), &body).await;
    assert!(succeeded(&plain, true), "{}", plain.text());
    assert!(!plain.text().contains("\"usage\""), "{}", plain.text());
    let sent = generations(&engine).last().unwrap().body.clone();
    assert_eq!(
        sent["stream_options"]["continuous_usage_stats"], true,
        "the gateway asked for usage"
    );
    body["stream_options"] = json!({"include_usage": true});
    let with_usage = post(&url, Some(KEY), &body).await;
    assert!(succeeded(&with_usage, true));
    let usage_chunks = with_usage
        .sse_data()
        .iter()
        .filter(|d| d.contains("\"usage\""))
        .count();
    assert_eq!(
        usage_chunks,
        1,
        "only the final usage chunk the client asked for: {}",
        with_usage.text()
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn cached_tokens_the_engine_reports_pass_the_guard() {
    // An engine whose prefix cache finds a repeated prompt and says so in its usage.
    let engine = engine_with(SimConfig {
        enable_cache_report: true,
        ..sim(SimRole::Unified, SimFault::None, 40960, true)
    })
    .await;
    let pools = unified_pool("u", &[worker(&engine, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let base = format!("http://{}", gw.data_addr());
    let prompt = words(60);
    for chat in [false, true] {
        let (path, body) = ask(chat, &prompt, false, 4);
        let url = format!("{base}{path}");
        post(&url, Some(KEY), &body).await;
        let reply = post(&url, Some(KEY), &body).await;
        assert!(succeeded(&reply, false), "{}", reply.text());
        let cached = if chat {
            &reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        } else {
            &reply.json()["meta_info"]["cached_tokens"]
        };
        assert!(cached.as_u64().is_some_and(|c| c > 0), "{}", reply.text());
        // Streamed: in every /generate event's meta_info, in chat's final usage chunk.
        let (_, mut body) = ask(chat, &prompt, true, 4);
        if chat {
            body["stream_options"] = json!({"include_usage": true});
        }
        let reply = post(&url, Some(KEY), &body).await;
        assert!(succeeded(&reply, true), "{}", reply.text());
        assert!(
            reply.text().contains("\"cached_tokens\":"),
            "{}",
            reply.text()
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_hanging_engine_times_out_with_504() {
    let engine = engine_with(sim(SimRole::Unified, SimFault::Hang, 40960, true)).await;
    let text = config_with_pools(WINDOW, &unified_pool("u", &[worker(&engine, None)]))
        .replace("request_timeout = \"20s\"", "request_timeout = \"1s\"");
    let gw = gateway(&text).await;
    let (path, body) = ask(false, "anyone there?", false, 4);
    let reply = post(
        &format!("http://{}{path}", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(
        (reply.status.as_u16(), error_code(&reply).as_str()),
        (504, "upstream_timeout")
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn every_request_ends_in_exactly_one_counted_outcome() {
    let engine = engine_with(SimConfig {
        token_latency: std::time::Duration::from_millis(20),
        ..sim(SimRole::Unified, SimFault::None, 40960, true)
    })
    .await;
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("u", &[worker(&engine, None)]),
    ))
    .await;
    let base = format!("http://{}", gw.data_addr());
    let (path, body) = ask(false, "one", false, 2);
    assert_eq!(
        post(&format!("{base}{path}"), Some(KEY), &body)
            .await
            .status,
        200
    );
    let (path, body) = ask(true, "two", true, 2);
    assert!(succeeded(
        &post(&format!("{base}{path}"), Some(KEY), &body).await,
        true
    ));
    assert_eq!(
        post(&format!("{base}/generate"), Some(KEY), &json!({"text": 5}))
            .await
            .status,
        400
    );
    assert_eq!(
        post(&format!("{base}/generate"), None, &json!({"text": "x"}))
            .await
            .status,
        401
    );
    // A stream the client walks away from.
    let (path, body) = ask(false, &words(30), true, 200);
    let response = send(request(
        http::Method::POST,
        &format!("{base}{path}"),
        Some(KEY),
        body.to_string(),
    ))
    .await;
    let mut stream = response.into_body();
    use http_body_util::BodyExt;
    stream.frame().await.unwrap().unwrap();
    drop(stream);

    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let outcomes = loop {
        let lines: Vec<Value> = gw
            .audit()
            .recent()
            .into_iter()
            .filter(|l| l["event"] == "request")
            .collect();
        if lines.len() >= 5 || tokio::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let mut kinds: Vec<String> = outcomes
        .iter()
        .map(|l| l["outcome"].as_str().unwrap_or_default().to_owned())
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        ["client_cancelled", "error", "error", "success", "success"],
        "{outcomes:?}"
    );
    gw.shutdown().await;
}
