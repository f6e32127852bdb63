//! Per-tenant accounting (issue 40) end to end: a gateway in front of simulated engines
//! serving two models, two tenants sending a mix of whole and streamed answers, chat and
//! `/generate`, with requests refused by the gateway and failed by an engine. The
//! `kvgate_tenant_*` counters on `/metrics` must equal, per tenant and model, the usage the
//! engines reported to the clients, and count each request once by its outcome; the audit
//! line of each request carries the same numbers; every series exists at zero before the
//! first request.

mod support;

use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvgate::runtime::RunningGateway;
use kvgate_sim::{SimConfig, SimFault, SimRole};
use support::*;

const KEY_A: &str = "accounting-key-a";
const KEY_B: &str = "accounting-key-b";

/// Two tenants (`acct-b` may not use `qwen3-b`), three models: `qwen3` and `qwen3-b` on
/// healthy engines, `qwen3-bad` on one that drops every generation request.
fn config(a: &str, b: &str, bad: &str) -> String {
    let pool = |name: &str, model: &str, engine: &str| {
        format!(
            "[[pools]]\nname = \"{name}\"\nmodel = \"{model}\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{engine}]\n"
        )
    };
    format!(
        "[server]\ndrain_timeout = \"10s\"\n\n[upstream]\nrequest_timeout = \"20s\"\ndiscovery_interval = \"1h\"\n\n\
         [audit]\nsink = \"none\"\n\n{}\n{}\n{}\n{}\n{}\n{}\n{}{}models = [\"qwen3\", \"qwen3-bad\"]\npriority = \"critical\"\n",
        model_table("qwen3", 4096),
        model_table("qwen3-b", 4096),
        model_table("qwen3-bad", 4096),
        pool("pa", "qwen3", a),
        pool("pb", "qwen3-b", b),
        pool("pbad", "qwen3-bad", bad),
        tenant_table("acct-a", KEY_A),
        tenant_table("acct-b", KEY_B),
    )
    .replace("tokenizers/", &format!("{}/config/tokenizers/", repo().display()))
}

async fn sim(model: &str, fault: SimFault) -> kvgate_sim::RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        fault,
        kv_tokens: 65_536,
        context_length: 4096,
        model: model.into(),
        // OpenAI usage reports cached tokens (SGLang's --enable-cache-report).
        enable_cache_report: true,
        ..SimConfig::default()
    })
    .await
}

/// The value of the series `name{labels}` in a `/metrics` text.
fn series(text: &str, name: &str, labels: &str) -> Option<u64> {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

async fn metrics(gw: &RunningGateway) -> String {
    get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text()
}

/// The usage the client saw: a whole answer's `usage` / `meta_info`, a stream's last
/// report.
fn seen_usage(reply: &Reply, stream: bool) -> (u64, u64, u64) {
    let split = |v: &Value| -> Option<(u64, u64, u64)> {
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            return Some((
                u["prompt_tokens"].as_u64()?,
                u["completion_tokens"].as_u64()?,
                u["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .unwrap_or(0),
            ));
        }
        let m = v.get("meta_info")?;
        Some((
            m["prompt_tokens"].as_u64()?,
            m["completion_tokens"].as_u64()?,
            m["cached_tokens"].as_u64().unwrap_or(0),
        ))
    };
    let found = if stream {
        reply
            .sse_data()
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| split(&v))
            .last()
    } else {
        split(&reply.json())
    };
    found.unwrap_or_else(|| panic!("no usage in {}", reply.text()))
}

#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
struct Tally {
    prompt: u64,
    completion: u64,
    cached: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_counters_equal_the_engines_usage_over_a_mixed_run() {
    let (a, b, bad) = (
        sim("qwen3", SimFault::None).await,
        sim("qwen3-b", SimFault::None).await,
        sim("qwen3-bad", SimFault::Reset).await,
    );
    let text = config(
        &worker(&a, Some(65_536)),
        &worker(&b, Some(65_536)),
        &worker(&bad, Some(65_536)),
    );
    let gw = gateway(&text).await;

    // Before any request: every tenant × model × outcome series and every pool's latency
    // histograms exist at zero.
    let before = metrics(&gw).await;
    for tenant in ["acct-a", "acct-b"] {
        for model in ["qwen3", "qwen3-b", "qwen3-bad"] {
            for outcome in ["ok", "refused", "engine_error", "guard_trip", "client_gone"] {
                let labels = format!("tenant=\"{tenant}\",model=\"{model}\",outcome=\"{outcome}\"");
                assert_eq!(
                    series(&before, "kvgate_tenant_requests_total", &labels),
                    Some(0),
                    "{labels}\n{before}"
                );
            }
            let labels = format!("tenant=\"{tenant}\",model=\"{model}\"");
            for name in [
                "kvgate_tenant_prompt_tokens_total",
                "kvgate_tenant_completion_tokens_total",
                "kvgate_tenant_cached_tokens_total",
            ] {
                assert_eq!(
                    series(&before, name, &labels),
                    Some(0),
                    "{name}{{{labels}}}"
                );
            }
        }
    }
    for pool in ["pa", "pb", "pbad"] {
        for name in [
            "kvgate_time_to_first_token_seconds_count",
            "kvgate_inter_token_seconds_count",
        ] {
            let labels = format!("pool=\"{pool}\",class=\"critical\"");
            assert_eq!(
                series(&before, name, &labels),
                Some(0),
                "{name}{{{labels}}}"
            );
        }
    }

    let chat_url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let generate_url = format!("http://{}/generate", gw.data_addr());
    // Long enough to fill KV pages: the repeats are served partly from the prefix cache.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let chat = |model: &str, stream: bool, text: &str| {
        let mut body = json!({"model": model, "max_tokens": 5, "stream": stream,
                              "messages": [{"role": "user", "content": text}]});
        if stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    let generate = |model: &str, stream: bool, text: &str| {
        json!({"model": model, "text": text, "stream": stream,
               "sampling_params": {"max_new_tokens": 4}})
    };
    // (tenant, key, model, url, body, stream, expected status; 500: any 5xx)
    let plan: Vec<(&str, &str, &str, &str, Value, bool, u16)> = vec![
        (
            "acct-a",
            KEY_A,
            "qwen3",
            chat_url.as_str(),
            chat("qwen3", false, &long),
            false,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3",
            chat_url.as_str(),
            chat("qwen3", true, &long),
            true,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3",
            chat_url.as_str(),
            chat("qwen3", false, &long),
            false,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3-b",
            generate_url.as_str(),
            generate("qwen3-b", false, &long),
            false,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3-b",
            generate_url.as_str(),
            generate("qwen3-b", true, &long),
            true,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3-b",
            chat_url.as_str(),
            chat("qwen3-b", true, "hello"),
            true,
            200,
        ),
        (
            "acct-a",
            KEY_A,
            "qwen3-bad",
            chat_url.as_str(),
            chat("qwen3-bad", false, "hi"),
            false,
            500,
        ),
        (
            "acct-b",
            KEY_B,
            "qwen3",
            chat_url.as_str(),
            chat("qwen3", false, "hi there"),
            false,
            200,
        ),
        (
            "acct-b",
            KEY_B,
            "qwen3",
            chat_url.as_str(),
            chat("qwen3", true, "hi there"),
            true,
            200,
        ),
        (
            "acct-b",
            KEY_B,
            "qwen3",
            generate_url.as_str(),
            generate("qwen3", false, "hi"),
            false,
            200,
        ),
        (
            "acct-b",
            KEY_B,
            "qwen3-b",
            chat_url.as_str(),
            chat("qwen3-b", false, "hi"),
            false,
            403,
        ),
        (
            "acct-b",
            KEY_B,
            "qwen3-bad",
            chat_url.as_str(),
            chat("qwen3-bad", true, "hi"),
            true,
            500,
        ),
    ];
    let mut tallies: HashMap<(&str, &str), Tally> = HashMap::new();
    let mut outcomes: HashMap<(&str, &str, &str), u64> = HashMap::new();
    for &(tenant, key, model, url, ref body, stream, status) in &plan {
        let reply = post(url, Some(key), body).await;
        let got = match reply.status.as_u16() {
            s if s >= 500 => 500,
            s => s,
        };
        assert_eq!(got, status, "{tenant} {model} {}", reply.text());
        let outcome = match status {
            200 => {
                let (p, c, k) = seen_usage(&reply, stream);
                let t = tallies.entry((tenant, model)).or_default();
                t.prompt += p;
                t.completion += c;
                t.cached += k;
                "ok"
            }
            500 => "engine_error",
            _ => "refused",
        };
        *outcomes.entry((tenant, model, outcome)).or_default() += 1;
    }
    // Over the context window: refused by admission, after the tenant is known.
    let over = json!({"model": "qwen3", "max_tokens": 100_000,
                      "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&chat_url, Some(KEY_A), &over).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    *outcomes.entry(("acct-a", "qwen3", "refused")).or_default() += 1;
    // A stream whose usage the client did not ask for: kvgate asks the engine and strips
    // it again, and still counts it (its prompt is the one `acct-b` sent before).
    let mut hidden = chat("qwen3", true, "hi there");
    if let Some(o) = hidden.as_object_mut() {
        o.remove("stream_options");
    }
    let reply = post(&chat_url, Some(KEY_B), &hidden).await;
    assert_eq!(reply.status, 200);
    assert!(!reply.text().contains("\"usage\""), "{}", reply.text());
    *outcomes.entry(("acct-b", "qwen3", "ok")).or_default() += 1;

    // Streams are settled when their body is dropped, a moment after the client saw its
    // end: wait for every request to be counted.
    let expected_requests: u64 = outcomes.values().sum();
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = metrics(&gw).await;
        let counted: u64 = ["acct-a", "acct-b"]
            .iter()
            .flat_map(|t| ["qwen3", "qwen3-b", "qwen3-bad"].map(move |m| (t, m)))
            .flat_map(|(t, m)| {
                [
                    "ok",
                    "refused",
                    "engine_error",
                    "guard_trip",
                    "client_gone",
                    "internal_error",
                ]
                .map(move |o| (t, m, o))
            })
            .filter_map(|(t, m, o)| {
                series(
                    &text,
                    "kvgate_tenant_requests_total",
                    &format!("tenant=\"{t}\",model=\"{m}\",outcome=\"{o}\""),
                )
            })
            .sum();
        if counted >= expected_requests || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for ((tenant, model, outcome), n) in &outcomes {
        let labels = format!("tenant=\"{tenant}\",model=\"{model}\",outcome=\"{outcome}\"");
        assert_eq!(
            series(&text, "kvgate_tenant_requests_total", &labels),
            Some(*n),
            "{labels}"
        );
    }
    // The hidden stream's prompt is the visible one's; its completion is at most max_tokens.
    let b_prompt_once = {
        let t = tallies[&("acct-b", "qwen3")];
        t.prompt
    };
    for ((tenant, model), t) in &tallies {
        let labels = format!("tenant=\"{tenant}\",model=\"{model}\"");
        let get = |name: &str| series(&text, name, &labels).unwrap_or(u64::MAX);
        let (prompt, completion, cached) = (
            get("kvgate_tenant_prompt_tokens_total"),
            get("kvgate_tenant_completion_tokens_total"),
            get("kvgate_tenant_cached_tokens_total"),
        );
        if (*tenant, *model) == ("acct-b", "qwen3") {
            // Plus the hidden stream: the same prompt as the visible stream of "hi there".
            assert!(
                prompt > t.prompt && prompt < t.prompt + b_prompt_once,
                "{labels}: {prompt} vs {t:?}"
            );
            assert!(completion > t.completion && completion <= t.completion + 5);
            continue;
        }
        assert_eq!(
            (prompt, completion, cached),
            (t.prompt, t.completion, t.cached),
            "{labels}"
        );
    }
    let a = tallies[&("acct-a", "qwen3")];
    assert!(
        a.cached > 0,
        "the repeated long prompt was partly cached: {a:?}"
    );
    // Nothing was counted for what the engines never served.
    for (tenant, model) in [
        ("acct-b", "qwen3-b"),
        ("acct-a", "qwen3-bad"),
        ("acct-b", "qwen3-bad"),
    ] {
        let labels = format!("tenant=\"{tenant}\",model=\"{model}\"");
        assert_eq!(
            series(&text, "kvgate_tenant_prompt_tokens_total", &labels),
            Some(0)
        );
    }
    // Streams were timed: time to first token and the mean inter-token latency, in the
    // pool and the tenant's class (`acct-b` is critical, `acct-a` standard by default).
    assert!(
        series(
            &text,
            "kvgate_time_to_first_token_seconds_count",
            "pool=\"pa\",class=\"standard\""
        )
        .unwrap_or(0)
            >= 1
    );
    assert!(
        series(
            &text,
            "kvgate_time_to_first_token_seconds_count",
            "pool=\"pa\",class=\"critical\""
        )
        .unwrap_or(0)
            >= 2
    );
    assert!(
        series(
            &text,
            "kvgate_inter_token_seconds_count",
            "pool=\"pb\",class=\"standard\""
        )
        .unwrap_or(0)
            >= 1
    );

    // The audit line of every served request carries its numbers.
    let lines = gw.audit().recent();
    let served: Vec<&Value> = lines
        .iter()
        .filter(|l| l["event"] == "request" && (l["outcome"] == "success"))
        .collect();
    assert!(served.len() >= 9, "{lines:#?}");
    for line in &served {
        assert!(
            line["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
            "{line}"
        );
        assert!(line["completion_tokens"].as_u64().is_some(), "{line}");
        assert!(line["cached_tokens"].as_u64().is_some(), "{line}");
    }
    let streamed: Vec<&&Value> = served.iter().filter(|l| l["stream"] == true).collect();
    assert!(streamed.len() >= 4, "{served:#?}");
    for line in streamed {
        assert!(line["ttft_ms"].as_f64().is_some(), "{line}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_added_by_a_reload_has_its_series_at_zero_and_is_counted() {
    const TOKEN_ENV: &str = "KVGATE_ACCOUNTING_TEST_TOKEN";
    const TOKEN: &str = "accounting-test-token";
    const KEY_NEW: &str = "accounting-key-new";
    std::env::set_var(TOKEN_ENV, TOKEN);
    let engine = sim("qwen3", SimFault::None).await;
    let dir = std::env::temp_dir().join(format!("kvgate-accounting-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("kvgate.toml");
    let base = config_with_pools(
        4096,
        &unified_pool("reloaded", &[worker(&engine, Some(65_536))]),
    )
    .replace(
        "[server]\n",
        &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
    )
    .replace("name = \"t1\"", "name = \"acct-before\"")
    .replace(
        "tokenizers/",
        &format!("{}/config/tokenizers/", repo().display()),
    );
    std::fs::write(&path, &base).expect("write the config");
    let config = kvgate::config::Config::load(&path).expect("the config loads");
    let gw = kvgate::runtime::Gateway::new(config)
        .expect("gateway builds")
        .start(bind().await, bind().await)
        .await
        .expect("gateway starts");
    let labels = "tenant=\"acct-new\",model=\"qwen3\",outcome=\"ok\"";
    assert_eq!(
        series(&metrics(&gw).await, "kvgate_tenant_requests_total", labels),
        None,
        "not configured yet"
    );

    std::fs::write(
        &path,
        format!("{base}\n{}", tenant_table("acct-new", KEY_NEW)),
    )
    .expect("add a tenant");
    let reply = admin(&gw, http::Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = metrics(&gw).await;
    assert_eq!(
        series(&text, "kvgate_tenant_requests_total", labels),
        Some(0),
        "{text}"
    );
    assert_eq!(
        series(
            &text,
            "kvgate_tenant_prompt_tokens_total",
            "tenant=\"acct-new\",model=\"qwen3\""
        ),
        Some(0)
    );

    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let body = json!({"model": "qwen3", "max_tokens": 3,
                      "messages": [{"role": "user", "content": "counted after the reload"}]});
    let reply = post(&url, Some(KEY_NEW), &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (prompt, _, _) = seen_usage(&reply, false);
    let text = metrics(&gw).await;
    assert_eq!(
        series(&text, "kvgate_tenant_requests_total", labels),
        Some(1)
    );
    assert_eq!(
        series(
            &text,
            "kvgate_tenant_prompt_tokens_total",
            "tenant=\"acct-new\",model=\"qwen3\""
        ),
        Some(prompt)
    );
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// The event streams the guard follows in their own protocol (`/v1/responses` events, and
/// Anthropic events an engine wrote itself) are counted at their end like chat streams: the
/// tenant's tokens as the final event reported them, a time to first token, and an audit
/// line that carries both and says how the stream ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_engine_written_anthropic_streams_are_counted_at_their_end() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    // The engine's Anthropic request has no cache salt: the pool must say it shares.
    let pool = format!(
        "{}cache_salt = false\n",
        unified_pool("u", &[worker(&engine, None)])
    );
    let text = config_with_pools(4096, &pool).replace(
        &model_table("qwen3", 4096),
        &format!(
            "{}anthropic_messages = \"engine\"\n",
            model_table("qwen3", 4096)
        ),
    );
    let gw = gateway(&text).await;
    let labels = "tenant=\"t1\",model=\"qwen3\"";
    let ok = format!("{labels},outcome=\"ok\"");
    assert_eq!(
        series(&metrics(&gw).await, "kvgate_tenant_requests_total", &ok),
        Some(0)
    );

    let base = format!("http://{}", gw.data_addr());
    let responses = post(
        &format!("{base}/v1/responses"),
        Some(KEY),
        &json!({"model": "qwen3", "input": "Count to three.", "stream": true,
                "max_output_tokens": 6}),
    )
    .await;
    assert_eq!(responses.status, 200, "{}", responses.text());
    let completed = responses
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["type"] == "response.completed" || v["type"] == "response.incomplete")
        .unwrap_or_else(|| panic!("no final event in {}", responses.text()));
    let usage = &completed["response"]["usage"];
    let (r_in, r_out) = (
        usage["input_tokens"].as_u64().unwrap_or(0),
        usage["output_tokens"].as_u64().unwrap_or(0),
    );
    assert!(r_in > 0 && r_out > 0, "{usage}");

    let messages = post(
        &format!("{base}/v1/messages"),
        Some(KEY),
        &json!({"model": "qwen3", "max_tokens": 5, "stream": true,
                "messages": [{"role": "user", "content": "Say hello."}]}),
    )
    .await;
    assert_eq!(messages.status, 200, "{}", messages.text());
    let events: Vec<Value> = messages
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .collect();
    let start = events
        .iter()
        .find(|v| v["type"] == "message_start")
        .unwrap_or_else(|| panic!("no message_start in {}", messages.text()));
    let m_in = start["message"]["usage"]["input_tokens"]
        .as_u64()
        .unwrap_or(0)
        + start["message"]["usage"]["cache_read_input_tokens"]
            .as_u64()
            .unwrap_or(0);
    let m_out = events
        .iter()
        .filter_map(|v| {
            (v["type"] == "message_delta").then(|| v["usage"]["output_tokens"].as_u64())
        })
        .flatten()
        .last()
        .unwrap_or(0);
    assert!(m_in > 0 && m_out > 0, "{}", messages.text());

    // Settled when the stream's body goes, a moment after the client saw its end.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = metrics(&gw).await;
        let done = series(&text, "kvgate_tenant_requests_total", &ok) == Some(2);
        if done || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(series(&text, "kvgate_tenant_requests_total", &ok), Some(2));
    assert_eq!(
        series(&text, "kvgate_tenant_prompt_tokens_total", labels),
        Some(r_in + m_in)
    );
    assert_eq!(
        series(&text, "kvgate_tenant_completion_tokens_total", labels),
        Some(r_out + m_out)
    );
    assert_eq!(
        series(
            &text,
            "kvgate_time_to_first_token_seconds_count",
            "pool=\"u\",class=\"standard\""
        ),
        Some(2)
    );
    // One audit line each, written at the end: success, the numbers, the time to first
    // token (and no second line written when the headers went out).
    let lines = gw.audit().recent();
    let requests: Vec<&Value> = lines.iter().filter(|l| l["event"] == "request").collect();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    for line in requests {
        assert_eq!(line["outcome"], "success", "{line}");
        assert_eq!(line["stream"], true, "{line}");
        assert!(
            line["prompt_tokens"].as_u64().is_some_and(|n| n > 0),
            "{line}"
        );
        assert!(
            line["completion_tokens"].as_u64().is_some_and(|n| n > 0),
            "{line}"
        );
        assert!(line["ttft_ms"].as_f64().is_some(), "{line}");
    }
    gw.shutdown().await;
}

/// A pool whose guard and leak scan are off still accounts for its tenants: the answers are
/// read (not checked) for the engine's usage and the stream's token times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_without_checks_still_counts_its_tenants_tokens_and_latency() {
    let engine = engine(SimRole::Unified, SimFault::None, 40960, 32768).await;
    let pool = format!(
        "{}leak_detection = \"off\"\n[pools.guard]\nenabled = false\n",
        unified_pool("unchecked", &[worker(&engine, None)])
    );
    // A tenant of its own: the other tests of this binary count t1 in the same registry.
    let gw =
        gateway(&config_with_pools(4096, &pool).replace("name = \"t1\"", "name = \"unchecked\""))
            .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let whole = post(
        &url,
        Some(KEY),
        &json!({"model": "qwen3", "max_tokens": 5, "messages": [{"role": "user", "content": "Hello there"}]}),
    )
    .await;
    assert_eq!(whole.status, 200, "{}", whole.text());
    let (p1, c1, _) = seen_usage(&whole, false);
    // A stream whose client asked for no usage: the engine is asked, the client is not
    // shown it, the tenant is counted.
    let streamed = post(
        &url,
        Some(KEY),
        &json!({"model": "qwen3", "max_tokens": 5, "stream": true,
                "messages": [{"role": "user", "content": "Hello there"}]}),
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(
        !streamed.text().contains("\"usage\""),
        "{}",
        streamed.text()
    );
    let ok = "tenant=\"unchecked\",model=\"qwen3\",outcome=\"ok\"";
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = metrics(&gw).await;
        if series(&text, "kvgate_tenant_requests_total", ok) == Some(2) || Instant::now() > deadline
        {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let labels = "tenant=\"unchecked\",model=\"qwen3\"";
    assert_eq!(series(&text, "kvgate_tenant_requests_total", ok), Some(2));
    assert_eq!(
        series(&text, "kvgate_tenant_prompt_tokens_total", labels),
        Some(2 * p1)
    );
    let completion = series(&text, "kvgate_tenant_completion_tokens_total", labels).unwrap_or(0);
    assert!(
        completion > c1 && completion <= c1 + 5,
        "{completion} vs {c1}"
    );
    assert_eq!(
        series(
            &text,
            "kvgate_time_to_first_token_seconds_count",
            "pool=\"unchecked\",class=\"standard\""
        ),
        Some(1)
    );
    gw.shutdown().await;
}
