//! The prefix cache over real sockets: what a repeated or growing prompt finds cached, how
//! cache partitions keep tenants apart, LRU eviction within the bound, the switch that turns
//! it off, the prefill charge, the reported fields and the `/metrics` counters.
//!
//! Pages are 16 tokens. A prompt of `n` tokens caches its `n / 16` full pages; a later
//! prompt matches at most `len - 1` of its tokens (the last one is always computed, as in
//! SGLang), so a repeat of a 40-token prompt finds 32 cached tokens, and so does a repeat of
//! a 48-token one. The prefill charge is read from the engine's counter, never a clock.

mod support;

use serde_json::{json, Value};
use support::*;

/// Bounds every wait for the engine: reached only when something is broken.
const PATIENCE: Duration = Duration::from_secs(30);

/// `n` distinct token ids starting at `start`.
fn ids(start: u32, n: usize) -> Vec<u32> {
    (start..start + n as u32).collect()
}

/// A `/generate` body for `input_ids`, with the extra top-level fields of `extra`.
fn generate(input_ids: &[u32], extra: Value) -> Value {
    let mut body = json!({"input_ids": input_ids, "sampling_params": {"max_new_tokens": 2}});
    if let (Some(map), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        map.extend(extra.clone());
    }
    body
}

/// The `cached_tokens` `/generate` reported for one prompt.
async fn cached(sim: &RunningSim, body: &Value) -> u64 {
    let (status, out) = post(sim.http_addr, "/generate", body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    out["meta_info"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {out}"))
}

/// The value of the one sample of `name` in a Prometheus text body.
fn sample(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn metrics(sim: &RunningSim) -> String {
    let (status, bytes) = send(sim.http_addr, Method::GET, "/metrics", Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test]
async fn a_repeated_prompt_finds_its_full_pages_and_is_charged_the_rest() {
    let sim = start(config(SimRole::Unified)).await;
    let forty = ids(1000, 40);
    assert_eq!(cached(&sim, &generate(&forty, json!({}))).await, 0);
    // Two full pages of 16; the 8 tokens of the partial third page are computed again.
    assert_eq!(cached(&sim, &generate(&forty, json!({}))).await, 32);
    let stats = sim.engine.stats();
    assert_eq!(stats.prompt_tokens, 80);
    assert_eq!(stats.cached_tokens, 32);
    assert_eq!(stats.prefill_tokens_charged, 40 + 8);
    assert_eq!(stats.prefix_cache_blocks, 2);

    // Exactly three pages: the repeat matches two, since its last token is always computed.
    let forty_eight = ids(5000, 48);
    assert_eq!(cached(&sim, &generate(&forty_eight, json!({}))).await, 0);
    assert_eq!(cached(&sim, &generate(&forty_eight, json!({}))).await, 32);
    assert_eq!(sim.engine.stats().prefix_cache_blocks, 5);

    // A text prompt too; the answer itself is unchanged by the cache.
    let body = json!({"text": PROMPT, "sampling_params": {"max_new_tokens": 3}});
    let n = QWEN3.encode(PROMPT, true).unwrap().len() as u64;
    let (_, first) = post(sim.http_addr, "/generate", &body).await;
    let (_, again) = post(sim.http_addr, "/generate", &body).await;
    assert_eq!(first["meta_info"]["cached_tokens"], 0);
    assert_eq!(again["meta_info"]["cached_tokens"], (n - 1) / 16 * 16);
    assert_eq!(again["text"], first["text"]);
    assert_eq!(again["meta_info"]["prompt_tokens"], n);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_growing_conversation_hits_the_previous_turn() {
    let sim = start(config(SimRole::Unified)).await;
    // Token ids: turn two is turn one plus more, so turn one's full pages all match.
    let turn1 = ids(100, 37);
    let mut turn2 = turn1.clone();
    turn2.extend(ids(9000, 30));
    assert_eq!(cached(&sim, &generate(&turn1, json!({}))).await, 0);
    assert_eq!(cached(&sim, &generate(&turn2, json!({}))).await, 32);
    // Turn two's own full pages (4 of its 67 tokens) are cached for turn three.
    let mut turn3 = turn2.clone();
    turn3.extend(ids(20_000, 5));
    assert_eq!(cached(&sim, &generate(&turn3, json!({}))).await, 64);

    // A chat through the real template: the second turn repeats the first turn's rendered
    // prompt, then the answer and the next question.
    let first =
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]);
    let (status, out) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": first, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let answer = out["choices"][0]["message"]["content"].clone();
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": answer}));
    second.push(json!({"role": "user", "content": "And what does a page hold?"}));
    let render = |messages: &Value| {
        let text = QWEN3.apply_chat_template(messages, None, true).unwrap();
        QWEN3.encode(&text, false).unwrap()
    };
    let (ids1, ids2) = (render(&first), render(&Value::Array(second.clone())));
    let common = ids1.iter().zip(&ids2).take_while(|(a, b)| a == b).count();
    let want = common.min(ids2.len() - 1) / 16 * 16;
    // The first turn's prompt up to its last full page is all there, whatever the template
    // does with the generation prompt at its end.
    assert!(
        want + 16 >= ids1.len() / 16 * 16,
        "{common} of {}",
        ids1.len()
    );
    let before = sim.engine.stats().cached_tokens;
    let (status, _) = post(
        sim.http_addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": second, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.engine.stats().cached_tokens - before, want as u64);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_partition_never_finds_another_partitions_pages() {
    let sim = start(SimConfig {
        enable_cache_report: true,
        ..config(SimRole::Unified)
    })
    .await;
    let prompt = ids(300, 40);
    let salted = |salt: &str| generate(&prompt, json!({"cache_salt": salt}));
    assert_eq!(cached(&sim, &salted("tenant-a")).await, 0);
    // Same tokens, another salt, or none: nothing of tenant a's.
    assert_eq!(cached(&sim, &salted("tenant-b")).await, 0);
    assert_eq!(cached(&sim, &generate(&prompt, json!({}))).await, 0);
    // Each partition finds its own pages; "" is the default partition, as absent.
    assert_eq!(cached(&sim, &salted("tenant-b")).await, 32);
    assert_eq!(cached(&sim, &salted("tenant-a")).await, 32);
    assert_eq!(cached(&sim, &salted("")).await, 32);
    // SGLang's extra_key partitions too, apart from the salt it comes with.
    let keyed = generate(&prompt, json!({"cache_salt": "tenant-a", "extra_key": "k"}));
    assert_eq!(cached(&sim, &keyed).await, 0);
    assert_eq!(cached(&sim, &keyed).await, 32);

    // The OpenAI APIs take the salt at the top level; the report shows what was found.
    let chat = |salt: &str| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
               "max_tokens": 2, "cache_salt": salt})
    };
    let details = |out: &Value| out["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &chat("tenant-a")).await;
    assert_eq!(details(&out), 0);
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &chat("tenant-b")).await;
    assert_eq!(details(&out), 0);
    let (_, out) = post(sim.http_addr, "/v1/chat/completions", &chat("tenant-a")).await;
    let n = out["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(details(&out), (n - 1) / 16 * 16);

    // A batch takes one salt per prompt; a salt that is no string is refused.
    let batch = json!({"input_ids": [prompt, prompt], "cache_salt": ["tenant-b", "tenant-c"],
                       "sampling_params": {"max_new_tokens": 1}});
    let (status, out) = post(sim.http_addr, "/generate", &batch).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(out[0]["meta_info"]["cached_tokens"], 32);
    assert_eq!(out[1]["meta_info"]["cached_tokens"], 0);
    let (status, _) = post(
        sim.http_addr,
        "/generate",
        &generate(&prompt, json!({"cache_salt": 7})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_least_recently_used_pages_are_evicted_within_the_bound() {
    // Room for four pages: the pool itself, or a smaller --prefix-cache-tokens bound.
    let small_pool = SimConfig {
        kv_tokens: 64,
        ..config(SimRole::Unified)
    };
    let small_cache = SimConfig {
        prefix_cache_tokens: Some(64),
        ..config(SimRole::Unified)
    };
    for config in [small_pool, small_cache] {
        let sim = start(config).await;
        // Three prompts of two full pages each (and one token more).
        let (a, b, c) = (ids(100, 33), ids(200, 33), ids(300, 33));
        for prompt in [&a, &b, &c] {
            assert_eq!(cached(&sim, &generate(prompt, json!({}))).await, 0);
        }
        // c's pages pushed out a's, the oldest; b's and c's stay.
        assert_eq!(sim.engine.stats().prefix_cache_blocks, 4);
        assert_eq!(cached(&sim, &generate(&b, json!({}))).await, 32);
        // b was just used, so a's return pushes out c's pages, not b's.
        assert_eq!(cached(&sim, &generate(&a, json!({}))).await, 0);
        assert_eq!(cached(&sim, &generate(&b, json!({}))).await, 32);
        assert_eq!(cached(&sim, &generate(&a, json!({}))).await, 32);
        assert_eq!(cached(&sim, &generate(&c, json!({}))).await, 0);
        assert_eq!(sim.engine.stats().prefix_cache_blocks, 4);
        // The cache is its own account: no page of the pool stays held.
        assert_eq!(sim.engine.used_kv_tokens(), 0);
        sim.shutdown().await;
    }
}

#[tokio::test]
async fn with_the_radix_cache_disabled_nothing_is_cached() {
    let sim = start(SimConfig {
        disable_radix_cache: true,
        enable_cache_report: true,
        ..config(SimRole::Unified)
    })
    .await;
    let prompt = ids(700, 40);
    for _ in 0..3 {
        assert_eq!(cached(&sim, &generate(&prompt, json!({}))).await, 0);
    }
    let chat =
        json!({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2});
    for _ in 0..2 {
        let (_, out) = post(sim.http_addr, "/v1/chat/completions", &chat).await;
        assert_eq!(out["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let stats = sim.engine.stats();
    assert_eq!(stats.cached_tokens, 0);
    assert_eq!(stats.prefix_cache_blocks, 0);
    // Every prompt token is charged.
    assert_eq!(stats.prefill_tokens_charged, stats.prompt_tokens);
    let (_, info) = get(sim.http_addr, "/get_server_info").await;
    assert_eq!(info["disable_radix_cache"], true);
    let text = metrics(&sim).await;
    assert_eq!(sample(&text, "sglang:cached_tokens_total"), 0.0);
    assert_eq!(sample(&text, "sglang:cache_hit_rate"), 0.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn streams_report_cached_tokens_and_cache_their_prompt_by_the_first_token() {
    let sim = start(SimConfig {
        enable_cache_report: true,
        ..config(SimRole::Unified)
    })
    .await;
    let prompt = ids(400, 50);
    let mut body = generate(&prompt, json!({"stream": true}));
    body["sampling_params"]["max_new_tokens"] = json!(3);
    let meta = |events: &[Value]| -> Vec<Value> {
        let data = events.iter().filter(|e| e.is_object());
        data.map(|e| e["meta_info"]["cached_tokens"].clone())
            .collect()
    };
    let (_, events) = post_sse(sim.http_addr, "/generate", &body).await;
    assert!(meta(&events).iter().all(|c| *c == 0), "{events:?}");
    // Read to its end, the first stream's prompt is cached: every event of the repeat says so.
    let (_, events) = post_sse(sim.http_addr, "/generate", &body).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let cached = meta(&events);
    assert!(
        !cached.is_empty() && cached.iter().all(|c| *c == 48),
        "{events:?}"
    );

    // OpenAI: the final usage chunk carries the details; without include_usage there is none.
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                      "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}});
    let usage = |events: &[Value]| events[events.len() - 2]["usage"].clone();
    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &chat).await;
    assert_eq!(
        usage(&events)["prompt_tokens_details"],
        json!({"cached_tokens": 0})
    );
    let (_, events) = post_sse(sim.http_addr, "/v1/chat/completions", &chat).await;
    let n = usage(&events)["prompt_tokens"].as_u64().unwrap();
    assert_eq!(
        usage(&events)["prompt_tokens_details"],
        json!({"cached_tokens": (n - 1) / 16 * 16})
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_prompt_still_prefilling_is_no_hit_and_a_client_gone_before_its_first_token_caches_nothing(
) {
    // The first token is a minute away: no stream here ever reaches it.
    let sim = start(SimConfig {
        first_token_latency: Duration::from_secs(60),
        ..config(SimRole::Unified)
    })
    .await;
    let body = generate(&ids(600, 40), json!({"stream": true}));
    let addr = sim.http_addr;
    let first = tokio::spawn({
        let body = body.clone();
        async move { post_sse(addr, "/generate", &body).await }
    });
    // A started stream has been looked up and charged.
    sim.engine
        .wait_for_stats(PATIENCE, |s| s.streams_started == 1)
        .await
        .expect("the first stream starts");
    let second = tokio::spawn(async move { post_sse(addr, "/generate", &body).await });
    sim.engine
        .wait_for_stats(PATIENCE, |s| s.streams_started == 2)
        .await
        .expect("the second stream starts");
    // The first prompt's prefill is not over: the second computes its own.
    let stats = sim.engine.stats();
    assert_eq!(stats.cached_tokens, 0);
    assert_eq!(stats.prefill_tokens_charged, 80);
    first.abort();
    second.abort();
    sim.engine
        .wait_for_stats(PATIENCE, |s| s.streams_cancelled == 2)
        .await
        .expect("both streams end with their clients");
    assert_eq!(sim.engine.stats().prefix_cache_blocks, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn pd_the_prefill_caches_and_the_decode_reports_what_it_found() {
    let prefill = start(config(SimRole::Prefill)).await;
    let decode = start(config(SimRole::Decode)).await;
    let prompt = ids(800, 40);
    for (room, want) in [(11, 0), (12, 32)] {
        let body = with_bootstrap(
            generate(&prompt, json!({"cache_salt": "t"})),
            &prefill,
            json!(room),
        );
        let ((p_status, p_out), (d_status, d_out)) =
            pd_post(&prefill, &decode, "/generate", &body).await;
        assert_eq!(p_status, StatusCode::OK, "{p_out}");
        assert_eq!(d_status, StatusCode::OK, "{d_out}");
        assert_eq!(p_out["meta_info"]["cached_tokens"], want);
        assert_eq!(d_out["meta_info"]["cached_tokens"], want);
        assert_eq!(d_out["meta_info"]["prompt_tokens"], 40);
    }
    let p = prefill.engine.stats();
    assert_eq!((p.prompt_tokens, p.cached_tokens), (80, 32));
    assert_eq!(p.prefill_tokens_charged, 48);
    assert_eq!(p.prefix_cache_blocks, 2);
    // The decode computed no prompt: it counts nothing, caches nothing.
    let d = decode.engine.stats();
    assert_eq!(
        (d.prompt_tokens, d.cached_tokens, d.prefix_cache_blocks),
        (0, 0, 0)
    );
    let text = metrics(&decode).await;
    assert_eq!(sample(&text, "sglang:prompt_tokens_total"), 0.0);
    let text = metrics(&prefill).await;
    assert_eq!(sample(&text, "sglang:cached_tokens_total"), 32.0);
    prefill.shutdown().await;
    decode.shutdown().await;
}

#[tokio::test]
async fn metrics_count_prompt_and_cached_tokens_and_their_ratio() {
    let sim = start(config(SimRole::Unified)).await;
    let text = metrics(&sim).await;
    assert_eq!(sample(&text, "sglang:prompt_tokens_total"), 0.0);
    assert_eq!(sample(&text, "sglang:cache_hit_rate"), 0.0);
    let (a, b) = (ids(100, 40), ids(100, 70));
    let mut prompt_tokens = 0;
    let mut cached_tokens = 0;
    for (prompt, salt) in [(&a, "x"), (&a, "x"), (&b, "x"), (&b, "y"), (&a, "y")] {
        let (status, out) = post(
            sim.http_addr,
            "/generate",
            &generate(prompt, json!({"cache_salt": salt})),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        prompt_tokens += out["meta_info"]["prompt_tokens"].as_u64().unwrap();
        cached_tokens += out["meta_info"]["cached_tokens"].as_u64().unwrap();
    }
    // Salt x: 0, then 32, then b (which starts with a) finds a's two pages: 32.
    // Salt y: b finds nothing of x's, then a finds b's first two pages: 32.
    assert_eq!(cached_tokens, 32 + 32 + 32);
    let text = metrics(&sim).await;
    assert!(
        text.contains("# TYPE sglang:prompt_tokens_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE sglang:cached_tokens_total counter\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE sglang:cache_hit_rate gauge\n"),
        "{text}"
    );
    assert!(text.contains("sglang:prompt_tokens_total{model_name=\"qwen3-sim\"} "));
    assert_eq!(
        sample(&text, "sglang:prompt_tokens_total"),
        prompt_tokens as f64
    );
    assert_eq!(
        sample(&text, "sglang:cached_tokens_total"),
        cached_tokens as f64
    );
    let rate = sample(&text, "sglang:cache_hit_rate");
    assert!((rate - cached_tokens as f64 / prompt_tokens as f64).abs() < 1e-12);
    let stats = sim.engine.stats();
    assert_eq!(stats.prefill_tokens_charged, prompt_tokens - cached_tokens);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_shared_lower_tier_finds_another_salts_prompt_and_says_so() {
    // Issue 40's fault: the second level keys pages by their tokens alone.
    let sim = start(SimConfig {
        fault: SimFault::SharedLowerTier,
        ..config(SimRole::Unified)
    })
    .await;
    let prompt = ids(300, 40);
    let salted = |salt: &str| generate(&prompt, json!({"cache_salt": salt}));
    assert_eq!(cached(&sim, &salted("tenant-a")).await, 0);
    assert_eq!(
        cached(&sim, &salted("tenant-b")).await,
        32,
        "found across salts"
    );
    assert_eq!(sim.engine.stats().prefill_tokens_charged, 40 + 8);
    let (_, info) = get(sim.http_addr, "/get_server_info").await;
    assert_eq!(info["enable_hierarchical_cache"], true);
    assert_eq!(info["hicache_storage_backend"], "file");
    sim.shutdown().await;

    // The silent form reuses them too, but reports nothing cached and no tier.
    let sim = start(SimConfig {
        fault: SimFault::SharedLowerTierSilent,
        ..config(SimRole::Unified)
    })
    .await;
    assert_eq!(cached(&sim, &salted("tenant-a")).await, 0);
    assert_eq!(cached(&sim, &salted("tenant-b")).await, 0, "not reported");
    assert_eq!(
        sim.engine.stats().prefill_tokens_charged,
        40 + 8,
        "yet not computed again"
    );
    let (_, info) = get(sim.http_addr, "/get_server_info").await;
    assert_eq!(info["enable_hierarchical_cache"], false);
    assert!(info["hicache_storage_backend"].is_null());
    sim.shutdown().await;

    // The healthy engine: nothing across salts, and no tier reported.
    let sim = start(config(SimRole::Unified)).await;
    assert_eq!(cached(&sim, &salted("tenant-a")).await, 0);
    assert_eq!(cached(&sim, &salted("tenant-b")).await, 0);
    sim.shutdown().await;
}
