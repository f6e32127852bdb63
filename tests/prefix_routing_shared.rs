//! Prefix indexes shared between gateway replicas through the Redis they use for limits
//! (issue 31, second part), on a real `redis-server` and simulated engines:
//!
//! - a conversation whose next turn goes through the other replica lands on the worker the
//!   first replica sent its previous turn to, once the other replica has read the first
//!   one's inserts (waited for by watching its index, never by a clock);
//! - with Redis gone, each replica keeps routing by its own index (`kvgate_prefix_shared_ok`
//!   0), and shares again once Redis is back.

mod support;
mod support_redis;

use serde_json::{json, Value};
use std::time::Duration;

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 4096;
const SALT_ENV: &str = "KVGATE_PREFIX_SHARED_TEST_SALT";

async fn sims(n: usize) -> Vec<RunningSim> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(
            engine_with(SimConfig {
                role: SimRole::Unified,
                model: "qwen3".into(),
                kv_tokens: WINDOW as usize,
                context_length: WINDOW as usize,
                ..SimConfig::default()
            })
            .await,
        );
    }
    out
}

/// One pool over `engines`, limits (and prefix indexes) in the Redis at `url`, one salt
/// secret for both replicas (their tenants' cache partitions must agree).
fn config(engines: &[RunningSim], url: &str, prefix: &str) -> String {
    config_at(engines, &format!("redis_url = \"{url}\""), prefix)
}

/// [`config`] with the Redis `at` names (`redis_url = …`, `redis_cluster = […]`).
fn config_at(engines: &[RunningSim], at: &str, prefix: &str) -> String {
    std::env::set_var(SALT_ENV, "one secret for every replica");
    let workers: Vec<String> = engines.iter().map(|e| worker(e, Some(WINDOW))).collect();
    config_with_pools(WINDOW, &unified_pool("shared", &workers)).replace(
        "[audit]\n",
        &format!(
            "[isolation]\nsalt_secret_env = \"{SALT_ENV}\"\n\n[limits]\nbackend = \"redis\"\n{at}\nkey_prefix = \"{prefix}\"\n\n[audit]\n"
        ),
    )
}

fn counts(engines: &[RunningSim]) -> Vec<usize> {
    engines.iter().map(|e| generations(e).len()).collect()
}

/// Send the conversation's next question through `gw`: the engine that served it, and the
/// conversation with the question and its answer added.
async fn turn(
    gw: &RunningGateway,
    engines: &[RunningSim],
    messages: &mut Vec<Value>,
    question: &str,
) -> usize {
    messages.push(json!({"role": "user", "content": question}));
    let body = json!({"model": "qwen3", "max_tokens": 4, "messages": messages});
    let before = counts(engines);
    let reply = post(
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(KEY),
        &body,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let after = counts(engines);
    messages.push(json!({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"].clone()}));
    (0..engines.len())
        .find(|&i| after[i] > before[i])
        .expect("an engine served it")
}

fn conversation(topic: &str) -> Vec<Value> {
    vec![json!({"role": "system", "content": format!(
        "You answer questions about {topic} for the {topic} desk, briefly, citing the {topic} handbook, for customers in three time zones."
    )})]
}

/// The blocks in `gw`'s index of pool "shared".
fn blocks(gw: &RunningGateway) -> usize {
    gw.fleet()
        .pool("shared")
        .and_then(|p| p.prefix.as_ref().map(|i| i.size().blocks))
        .unwrap_or(0)
}

/// Wait (bounded) until `gw`'s index holds at least `n` blocks.
async fn holds(gw: &RunningGateway, n: usize) {
    for _ in 0..1000 {
        if blocks(gw) >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the replica's index never held {n} blocks (it holds {})",
        blocks(gw)
    );
}

async fn shared_ok(gw: &RunningGateway) -> Option<f64> {
    let text = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    text.lines()
        .find(|l| l.starts_with("kvgate_prefix_shared_ok"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_keeps_its_worker_across_replicas() {
    let redis = support_redis::RedisServer::start();
    let engines = sims(3).await;
    let text = config(&engines, &redis.url(), "kvgate-prefix-share-test");
    keeps_its_worker(&engines, &text).await;
}

/// The same through a 3-primary Redis Cluster (issue 39); the stream is capped there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_keeps_its_worker_across_replicas_through_a_redis_cluster() {
    use support_redis::topology;
    if !topology::available() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(topology::RedisCluster::start)
        .await
        .expect("start the cluster");
    let engines = sims(3).await;
    let at = format!("redis_cluster = {}", cluster.urls_toml());
    let text = config_at(&engines, &at, "kvgate-prefix-cluster");
    keeps_its_worker(&engines, &text).await;
    let streams: Vec<_> = cluster
        .nodes
        .iter()
        .flat_map(topology::key_report)
        .filter(|(_, ty, _, _)| ty == "stream")
        .collect();
    assert!(
        streams
            .iter()
            .any(|(k, ..)| k == "kvgate-prefix-cluster:prefix:shared"),
        "the pool's stream lives in the cluster: {streams:?}"
    );
    for n in &cluster.nodes {
        topology::assert_every_key_expires(n, 1100);
    }
}

async fn keeps_its_worker(engines: &[RunningSim], text: &str) {
    let a = gateway(text).await;
    let b = gateway(text).await;
    for topic in ["billing", "shipping", "returns"] {
        let mut messages = conversation(topic);
        let home = turn(&a, engines, &mut messages, "How long does it take?").await;
        // B learns what A sent where, then the next turn through B goes there too.
        holds(&b, blocks(&a)).await;
        assert_eq!(
            turn(&b, engines, &mut messages, "And abroad?").await,
            home,
            "{topic}"
        );
        holds(&a, blocks(&b)).await;
        assert_eq!(
            turn(&a, engines, &mut messages, "Thanks!").await,
            home,
            "{topic}"
        );
    }
    // Stopped before the Redis goes: a share loop still running when it is killed would
    // count `unreachable` in this process's metrics, which another test here reads.
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_each_replica_routes_by_its_own_index_and_shares_again_once_it_is_back() {
    let mut redis = support_redis::RedisServer::start();
    let engines = sims(3).await;
    let text = config(&engines, &redis.url(), "kvgate-prefix-lost-test");
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    redis.kill();
    let mut messages = conversation("insurance");
    let home = turn(&a, &engines, &mut messages, "Am I covered?").await;
    for question in ["And my car?", "And my house?"] {
        assert_eq!(turn(&a, &engines, &mut messages, question).await, home);
    }
    for _ in 0..1000 {
        if shared_ok(&a).await == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        shared_ok(&a).await,
        Some(0.0),
        "the replica says it shares nothing"
    );
    assert_eq!(blocks(&b), 0, "nothing reached the other replica");
    redis.restart();
    // A's next turn is published once Redis answers; B then holds it.
    assert_eq!(
        turn(&a, &engines, &mut messages, "And my boat?").await,
        home
    );
    holds(&b, 1).await;
    assert_eq!(turn(&b, &engines, &mut messages, "Thanks!").await, home);
}

/// A counter's value on `gw`'s `/metrics` (summed over its label sets; 0 when absent).
async fn counter(gw: &RunningGateway, name: &str, label: &str) -> f64 {
    let text = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Wait (bounded) until `gw`'s counter `name` (with `label`) is at least 1.
async fn counted(gw: &RunningGateway, name: &str, label: &str) {
    for _ in 0..1000 {
        if counter(gw, name, label).await >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{name}{{{label}}} never counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_reset_behind_a_future_entry_is_read_again_and_bad_entries_are_counted() {
    let mut redis = support_redis::RedisServer::start();
    let engines = sims(3).await;
    let prefix = "kvgate-prefix-reset-test";
    let key = format!("{prefix}:prefix:shared");
    let text = config(&engines, &redis.url(), prefix);
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    // An entry dated far ahead (a replica with a wrong clock), then a malformed one after
    // it: both replicas read past them.
    let ahead = "4102444800000-0"; // 2100-01-01
    let added = redis.command(&[
        "XADD",
        &key,
        ahead,
        "r",
        "ghost",
        "w",
        "10.9.9.9:1",
        "k",
        "12345678",
    ]);
    assert!(!added.starts_with('-'), "{added}");
    redis.command(&["XADD", &key, "*", "r", "ghost", "k", "123"]);
    counted(&b, "kvgate_prefix_shared_bad_entries_total", "shared").await;
    // Redis restarts empty: new entries are dated now, behind what the replicas read.
    redis.restart();
    let mut messages = conversation("travel");
    let home = turn(&a, &engines, &mut messages, "Can I change my flight?").await;
    counted(&b, "kvgate_prefix_shared_problems_total", "restarted").await;
    holds(&b, 1).await;
    assert_eq!(
        turn(&b, &engines, &mut messages, "And my hotel?").await,
        home
    );

    // A key of another type is named as such, not as an unreachable Redis. (Metrics are
    // one registry per process: another test here kills its Redis and counts
    // `unreachable` meanwhile, so the classification is read from the reason Redis's
    // reply was given, not from an unchanged `unreachable` count.)
    redis.command(&["DEL", &key]);
    redis.command(&["SET", &key, "not a stream"]);
    counted(&a, "kvgate_prefix_shared_problems_total", "wrong_type").await;
    counted(
        &a,
        "kvgate_redis_problems_total",
        "reason=\"wrongtype\",user=\"prefix\"",
    )
    .await;
}
