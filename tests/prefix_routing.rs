//! Prefix-aware worker choice end to end (issue 31), on fleets of simulated engines. Which
//! worker served a request is read from the engines themselves (what each received), never
//! from timings.
//!
//! - a conversation's turns land on the worker that served its previous turn, several
//!   conversations at once (idle workers would otherwise take turns); in a PD pool the
//!   prefill worker follows the conversation;
//! - two tenants with identical prompts share affinity only where their engines share a
//!   cache: never on a pool with `cache_salt` (the second tenant's choice is by load), and
//!   on a pool without it they do;
//! - past `balance_margin` load wins over affinity (`balanced`), and within it affinity;
//! - a drained, ejected or reloaded-away worker leaves the index: its conversation moves,
//!   then sticks to its new worker.

mod support;

use http::Method;
use http_body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 4096;
const TOKEN_ENV: &str = "KVGATE_PREFIX_TEST_TOKEN";
const TOKEN: &str = "prefix-test-token";
const KEY2: &str = "second-tenant-key";

/// A "qwen3" engine of `role`, 4096 KV tokens, 10 ms per generated token.
async fn sim(role: SimRole) -> RunningSim {
    engine_with(SimConfig {
        role,
        model: "qwen3".into(),
        kv_tokens: WINDOW as usize,
        context_length: WINDOW as usize,
        token_latency: Duration::from_millis(10),
        ..SimConfig::default()
    })
    .await
}

async fn sims(n: usize) -> Vec<RunningSim> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(sim(SimRole::Unified).await);
    }
    out
}

/// The standard config with `pools`, an admin token, tenants t1 and t2, and `extra`
/// sections (`[prefix_routing]`, `[health]`).
fn config(pools: &str, extra: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    config_with_pools(WINDOW, pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace("[audit]\n", &format!("{extra}\n\n[audit]\n"))
        + &tenant_table("t2", KEY2)
}

fn workers(engines: &[RunningSim]) -> Vec<String> {
    engines.iter().map(|e| worker(e, Some(WINDOW))).collect()
}

/// A conversation: a system prompt of its own (several KV blocks), then turns.
struct Conversation {
    messages: Vec<Value>,
}

impl Conversation {
    fn new(topic: &str) -> Self {
        let system = format!(
            "You are the assistant of the {topic} desk. Answer questions about {topic} in plain words, cite the {topic} handbook where it helps, and keep every answer short. The {topic} desk serves customers in three time zones."
        );
        Self {
            messages: vec![json!({"role": "system", "content": system})],
        }
    }

    /// The chat body of the next turn, asking `question`.
    fn ask(&mut self, question: &str) -> Value {
        self.messages
            .push(json!({"role": "user", "content": question}));
        json!({"model": "qwen3", "max_tokens": 4, "messages": self.messages})
    }

    /// Keep the answer of the turn, as a client resending the history does.
    fn answered(&mut self, reply: &Reply) {
        let content = reply.json()["choices"][0]["message"]["content"].clone();
        self.messages
            .push(json!({"role": "assistant", "content": content}));
    }
}

/// How many generation requests each engine received so far.
fn counts(engines: &[RunningSim]) -> Vec<usize> {
    engines.iter().map(|e| generations(e).len()).collect()
}

/// Send `body` as the tenant of `key`; the index of the engine that served it.
async fn served(
    gw: &RunningGateway,
    engines: &[RunningSim],
    key: &str,
    body: &Value,
) -> (usize, Reply) {
    let before = counts(engines);
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(key), body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let after = counts(engines);
    let moved: Vec<usize> = (0..engines.len())
        .filter(|&i| after[i] > before[i])
        .collect();
    assert_eq!(
        moved.len(),
        1,
        "one engine served it: {before:?} -> {after:?}"
    );
    (moved[0], reply)
}

/// The next turn of `conversation`; the index of the engine that served it.
async fn turn(
    gw: &RunningGateway,
    engines: &[RunningSim],
    conversation: &mut Conversation,
    question: &str,
) -> usize {
    let body = conversation.ask(question);
    let (at, reply) = served(gw, engines, KEY, &body).await;
    conversation.answered(&reply);
    at
}

/// Open a chat stream of `body` (made a stream allowed `max_tokens` new tokens) and
/// return its body once the first event came: it is routed and holds its KV.
async fn open_stream(gw: &RunningGateway, key: &str, body: &Value, max_tokens: u64) -> Incoming {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["max_tokens"] = json!(max_tokens);
    let response = send(request(
        Method::POST,
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(key),
        body.to_string(),
    ))
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = body
        .frame()
        .await
        .expect("a first event")
        .expect("readable");
    assert!(first.is_data());
    assert!(!body.is_end_stream());
    body
}

/// The counter `name{pool=…,…}` from the admin port's `/metrics` (0 when absent).
async fn metric(gw: &RunningGateway, series: &str) -> f64 {
    let text = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    text.lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Poll (bounded) until no worker of `gw` holds KV: every request ended.
async fn idle(gw: &RunningGateway) {
    for _ in 0..1000 {
        if gw.fleet().workers().all(|w| w.kv_in_flight() == 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("workers still hold KV");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversations_turns_land_on_the_worker_that_served_its_previous_turn() {
    let engines = sims(3).await;
    let gw = gateway(&config(&unified_pool("sticky", &workers(&engines)), "")).await;
    let mut conversations: Vec<(Conversation, Option<usize>)> =
        ["billing", "shipping", "returns", "warranty"]
            .iter()
            .map(|topic| (Conversation::new(topic), None))
            .collect();
    for round in 0..4 {
        for (conversation, home) in conversations.iter_mut() {
            let at = turn(
                &gw,
                &engines,
                conversation,
                &format!("Question {round}: how long does it take?"),
            )
            .await;
            match home {
                None => *home = Some(at),
                Some(home) => assert_eq!(at, *home, "round {round}: the turn moved"),
            }
        }
    }
    // Idle workers take turns: the four conversations did not all land on one.
    let homes: std::collections::HashSet<usize> =
        conversations.iter().filter_map(|(_, h)| *h).collect();
    assert!(homes.len() > 1, "{homes:?}");
    let hits = metric(
        &gw,
        "kvgate_prefix_route_total{pool=\"sticky\",outcome=\"hit\"}",
    )
    .await;
    assert!(hits >= 12.0, "{hits} hits");
    assert!(metric(&gw, "kvgate_prefix_matched_blocks_total{pool=\"sticky\"}").await > 0.0);
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let index = &pools["pools"][0]["prefix_index"];
    assert!(index["blocks"].as_u64().unwrap_or(0) > 0, "{index}");
    assert_eq!(index["max_blocks"], 262_144);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_pd_pool_the_prefill_worker_follows_the_conversation() {
    let prefill = [sim(SimRole::Prefill).await, sim(SimRole::Prefill).await];
    let decode = [sim(SimRole::Decode).await, sim(SimRole::Decode).await];
    let gw = gateway(&config(
        &pd_pool("pd", &workers(&prefill), &workers(&decode)),
        "",
    ))
    .await;
    for topic in ["billing", "shipping"] {
        let mut conversation = Conversation::new(topic);
        let mut home = None;
        for round in 0..3 {
            let body = conversation.ask(&format!("Question {round}?"));
            let before = counts(&prefill);
            let (_, reply) = served(&gw, &decode, KEY, &body).await;
            conversation.answered(&reply);
            let after = counts(&prefill);
            let at = (0..2)
                .find(|&i| after[i] > before[i])
                .expect("a prefill leg");
            assert_eq!(*home.get_or_insert(at), at, "{topic} round {round}");
        }
    }
}

/// The identical prompt of two tenants, on a pool where the first tenant holds a stream
/// (about half the worker's KV) on the worker its prompt went to.
async fn identical_prompts(salted: bool) -> (usize, usize, usize) {
    let engines = sims(3).await;
    let mut pool = unified_pool("salt", &workers(&engines));
    if !salted {
        pool.push_str("cache_salt = false\n");
    }
    let gw = gateway(&config(&pool, "[prefix_routing]\nbalance_margin = 0.75")).await;
    let body = Conversation::new("tax").ask("What changed this year?");
    let before = counts(&engines);
    let _stream = open_stream(&gw, KEY, &body, 2000).await;
    let after = counts(&engines);
    let home = (0..3)
        .find(|&i| after[i] > before[i])
        .expect("the stream's engine");
    // Within the margin: the first tenant's prompt goes back to its busy worker …
    let (again, _) = served(&gw, &engines, KEY, &body).await;
    // … while the second tenant's goes where its own cache partition says.
    let (other, _) = served(&gw, &engines, KEY2, &body).await;
    (home, again, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_different_salts_never_share_affinity() {
    let (home, again, other) = identical_prompts(true).await;
    assert_eq!(again, home, "the first tenant sticks within the margin");
    assert_ne!(
        other, home,
        "the second tenant is routed by load, away from the busy worker"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_of_a_pool_without_salt_share_its_engines_cache_and_affinity() {
    let (home, again, other) = identical_prompts(false).await;
    assert_eq!(again, home);
    assert_eq!(other, home, "one cache for every tenant: the same worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_margin_load_wins_and_within_it_affinity() {
    let engines = sims(3).await;
    let gw = gateway(&config(
        &unified_pool("margin", &workers(&engines)),
        "[prefix_routing]\nbalance_margin = 0.25",
    ))
    .await;
    let body = Conversation::new("travel").ask("Which visa do I need?");
    let before = counts(&engines);
    let stream = open_stream(&gw, KEY, &body, 2000).await;
    let after = counts(&engines);
    let home = (0..3)
        .find(|&i| after[i] > before[i])
        .expect("the stream's engine");
    // Its worker holds about half its KV, the others none: over the margin of 0.25.
    let (elsewhere, _) = served(&gw, &engines, KEY, &body).await;
    assert_ne!(elsewhere, home, "load wins past the margin");
    let balanced = "kvgate_prefix_route_total{pool=\"margin\",outcome=\"balanced\"}";
    assert_eq!(metric(&gw, balanced).await, 1.0);
    // The stream ends: both workers hold the whole prompt now, and it stays with them.
    drop(stream);
    idle(&gw).await;
    for _ in 0..3 {
        let (at, _) = served(&gw, &engines, KEY, &body).await;
        assert!(at == home || at == elsewhere, "{at} holds none of it");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_leaves_the_index_and_its_conversation_sticks_to_its_new_worker() {
    let engines = sims(3).await;
    let gw = gateway(&config(&unified_pool("drain", &workers(&engines)), "")).await;
    let mut conversation = Conversation::new("insurance");
    let home = turn(&gw, &engines, &mut conversation, "Am I covered abroad?").await;
    assert_eq!(
        turn(&gw, &engines, &mut conversation, "And my car?").await,
        home
    );
    let drain = |action: &str| format!("/pools/drain/workers/{}/{action}", engines[home].http_addr);
    let reply = admin(&gw, Method::POST, &drain("drain"), Some(TOKEN)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let moved = turn(&gw, &engines, &mut conversation, "What about my house?").await;
    assert_ne!(moved, home);
    let reply = admin(&gw, Method::POST, &drain("undrain"), Some(TOKEN)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Back in service, the drained worker is forgotten: the conversation stays where it
    // moved, whatever the drained worker held of it before.
    for question in ["And my boat?", "And my bike?", "Thanks!"] {
        assert_eq!(
            turn(&gw, &engines, &mut conversation, question).await,
            moved
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ejected_worker_leaves_the_index_and_its_conversation_sticks_to_its_new_worker() {
    let mut engines = sims(3).await;
    let health = "[health]\nactive = false\n[health.outlier]\nconsecutive_failures = 1\nbase_ejection = \"30s\"";
    let gw = gateway(&config(&unified_pool("eject", &workers(&engines)), health)).await;
    let mut conversation = Conversation::new("mortgages");
    let home = turn(&gw, &engines, &mut conversation, "Fixed or variable?").await;
    // Its engine goes away: the next turn fails to connect there, is retried on another
    // worker, and the dead one is ejected.
    let dead = engines.remove(home);
    let dead_addr = dead.http_addr;
    dead.shutdown().await;
    let moved = turn(&gw, &engines, &mut conversation, "For how long?").await;
    let ejected = gw
        .fleet()
        .workers()
        .find(|w| w.authority == dead_addr.to_string())
        .map(|w| w.is_eligible());
    assert_eq!(ejected, Some(false), "the dead worker is out");
    for question in ["At what rate?", "With what fees?"] {
        assert_eq!(
            turn(&gw, &engines, &mut conversation, question).await,
            moved
        );
    }
}

fn write_config(path: &Path, pools: &str) {
    let text = config(pools, "").replace(
        "\"tokenizers/",
        &format!("\"{}/", repo().join("config/tokenizers").display()),
    );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_removed_by_a_reload_leaves_its_conversation_to_another_that_keeps_it() {
    let dir = std::env::temp_dir().join(format!("kvgate-prefix-reload-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    let engines = sims(3).await;
    write_config(&path, &unified_pool("reload", &workers(&engines)));
    let gw = kvgate::runtime::Gateway::new(kvgate::config::Config::load(&path).unwrap())
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap();
    let mut conversation = Conversation::new("pensions");
    let home = turn(&gw, &engines, &mut conversation, "When can I retire?").await;
    let kept: Vec<String> = (0..3)
        .filter(|&i| i != home)
        .map(|i| worker(&engines[i], Some(WINDOW)))
        .collect();
    write_config(&path, &unified_pool("reload", &kept));
    let reply = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let moved = turn(&gw, &engines, &mut conversation, "With how much?").await;
    assert_ne!(moved, home);
    for question in ["And my partner?", "Taxed how?"] {
        assert_eq!(
            turn(&gw, &engines, &mut conversation, question).await,
            moved
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
