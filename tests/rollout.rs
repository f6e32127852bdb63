//! Canary rollouts end to end, against simulated engines on 127.0.0.1:0: a faulty canary is
//! rolled back by the gateway's own traffic once the minimum sample is in (never before),
//! while the stable pool serves and no client sees a false success; the reason is on the
//! admin port, in the audit log and in the metrics; the rollback holds for a second replica
//! through a real Redis.

mod support;
mod support_redis;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

use kvgate::runtime::RunningGateway;
use kvgate_sim::{RunningSim, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const ADMIN_TOKEN: &str = "rollout-test-admin-token";
const MIN_REQUESTS: u64 = 12;

async fn healthy() -> RunningSim {
    engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await
}

/// Pools "stable" and "canary" at `weights`, one engine each, a rollout between them, the
/// admin token in a file, anonymous traffic allowed (split request by request).
fn canary_config(stable: &RunningSim, canary: &RunningSim, weights: (u32, u32)) -> String {
    let mut pools = unified_pool("stable", &[worker(stable, None)]);
    pools.push_str(&format!("weight = {}\n", weights.0));
    pools.push_str(&unified_pool("canary", &[worker(canary, None)]));
    pools.push_str(&format!("weight = {}\n", weights.1));
    pools.push_str(&format!(
        "\n[[rollouts]]\nmodel = \"qwen3\"\nstable = \"stable\"\ncanary = \"canary\"\nwindow = \"60s\"\nmin_requests = {MIN_REQUESTS}\n"
    ));
    let token_file = std::env::temp_dir().join(format!(
        "kvgate-rollout-admin-{}-{}",
        std::process::id(),
        canary.http_addr.port()
    ));
    std::fs::write(&token_file, format!("{ADMIN_TOKEN}\n")).expect("write the token file");
    config_with_pools(WINDOW, &pools).replace(
        "[server]\n",
        &format!(
            "[server]\nallow_anonymous = true\nadmin_token_file = \"{}\"\n",
            token_file.display()
        ),
    )
}

fn chat(i: usize) -> Value {
    json!({"model": "qwen3", "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("Question {i}: how do pages get reused?")}]})
}

async fn admin(gw: &RunningGateway, method: Method, path: &str, body: Value) -> Reply {
    let url = format!("http://{}{path}", gw.admin_addr());
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    read(send(request(method, &url, Some(ADMIN_TOKEN), body)).await).await
}

/// The one rollout, as `GET /rollouts` shows it.
async fn rollout(gw: &RunningGateway) -> Value {
    let reply = admin(gw, Method::GET, "/rollouts", Value::Null).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    reply.json()["rollouts"][0].clone()
}

/// Wait (bounded) until the rollout reaches `phase`; its report when it does.
async fn until_phase(gw: &RunningGateway, phase: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = rollout(gw).await;
        if r["decision"]["phase"] == phase {
            return r;
        }
        assert!(Instant::now() < deadline, "never reached {phase}: {r:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Send `n` anonymous chats; every 200 must come from the stable pool with the right
/// prompt count; the canary's answers must be errors. Returns how many reached the canary.
async fn traffic(gw: &RunningGateway, from: usize, n: usize) -> usize {
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let tokenizer = qwen3();
    let mut canary = 0;
    for i in from..from + n {
        let body = chat(i);
        let reply = post(&url, None, &body).await;
        let pool = reply
            .headers
            .get("x-kvgate-pool")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if reply.status == StatusCode::OK {
            assert_eq!(
                pool,
                "stable",
                "a 200 from the faulty canary: {}",
                reply.text()
            );
            let rendered = tokenizer
                .apply_chat_template(&body["messages"], None, true)
                .expect("render");
            let expected = tokenizer.count_rendered_chat(&rendered).expect("count");
            assert_eq!(
                reply.json()["usage"]["prompt_tokens"].as_u64(),
                Some(expected as u64)
            );
        } else {
            canary += 1;
            assert!(reply.status.is_server_error(), "{}", reply.text());
            assert!(!error_code(&reply).is_empty(), "{}", reply.text());
        }
    }
    canary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faulty_canary_is_rolled_back_by_its_own_traffic_and_no_client_sees_a_false_success() {
    let stable = healthy().await;
    let canary = engine(
        SimRole::Unified,
        SimFault::WrongPromptTokens,
        40960,
        WINDOW as usize,
    )
    .await;
    let gw = gateway(&canary_config(&stable, &canary, (50, 50))).await;

    // Below the minimum sample every canary answer trips the guard, yet nothing is decided:
    // a handful of requests cannot roll a pool back.
    let first = (MIN_REQUESTS as usize) - 2;
    let reached = traffic(&gw, 0, first).await;
    assert!(reached > 0 && (reached as u64) < MIN_REQUESTS);
    let r = rollout(&gw).await;
    assert_eq!(r["decision"]["phase"], "canary", "{r:#}");
    assert_eq!(r["canary"]["weight"], 50);

    // Enough traffic: rolled back at once, and only the stable pool answers afterwards.
    let mut sent = first;
    while generations(&canary).len() < MIN_REQUESTS as usize {
        traffic(&gw, sent, 1).await;
        sent += 1;
    }
    let r = until_phase(&gw, "rolled_back").await;
    let canary_seen = generations(&canary).len();
    assert_eq!(r["canary"]["weight"], 0, "{r:#}");
    assert_eq!(r["decision"]["origin"], "automatic");
    let breach = &r["decision"]["breach"];
    assert!(
        breach["signal"]
            .as_str()
            .is_some_and(|s| s.starts_with("guard_trips")),
        "{breach}"
    );
    assert_eq!(
        breach["canary"], 1.0,
        "every canary answer tripped: {breach}"
    );
    assert_eq!(breach["stable"], 0.0);
    assert!(breach["canary_requests"].as_u64() >= Some(MIN_REQUESTS));
    assert_eq!(
        traffic(&gw, sent, 20).await,
        0,
        "the canary still took traffic"
    );
    assert_eq!(generations(&canary).len(), canary_seen);

    // The audit line and the metric say which signal, with both rates.
    let line = gw
        .audit()
        .recent()
        .into_iter()
        .find(|l| l["event"] == "rollout_rolled_back")
        .expect("an audit line for the rollback");
    assert_eq!(line["signal"], breach["signal"]);
    assert_eq!(line["canary_rate"], 1.0);
    assert_eq!(line["stable_rate"], 0.0);
    let metrics = get(&format!("http://{}/metrics", gw.admin_addr()), None).await;
    let text = metrics.text();
    assert!(
        text.lines()
            .any(|l| l.starts_with("kvgate_rollout_rollbacks_total")
                && l.contains("pool=\"canary\"")
                && l.contains("origin=\"automatic\"")
                // Every signal's series exists at zero from start-up: the value counts.
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) >= Some(1.0)),
        "{text}"
    );
    // The pools listing shows the live rates behind the decision.
    let pools = admin(&gw, Method::GET, "/pools", Value::Null).await.json();
    let canary_pool = pools["pools"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["pool"] == "canary"))
        .expect("canary listed")
        .clone();
    assert_eq!(canary_pool["weight"], 0);
    assert_eq!(canary_pool["configured_weight"], 50);
    assert_eq!(canary_pool["rates"]["guard_trip_rate"], 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_keeps_its_share_and_is_promoted_or_cleared_by_hand() {
    let stable = healthy().await;
    let canary = healthy().await;
    let gw = gateway(&canary_config(&stable, &canary, (50, 50))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for i in 0..(3 * MIN_REQUESTS as usize) {
        assert_eq!(post(&url, None, &chat(i)).await.status, StatusCode::OK);
    }
    let r = rollout(&gw).await;
    assert_eq!(r["decision"]["phase"], "canary", "{r:#}");
    assert!(r["canary"]["rates"]["requests"].as_u64() >= Some(MIN_REQUESTS));

    // By hand: rollback with a reason, clear it, promote.
    let r = admin(
        &gw,
        Method::POST,
        "/rollouts/qwen3/rollback",
        json!({"reason": "pager says so"}),
    )
    .await
    .json();
    assert_eq!(r["decision"]["phase"], "rolled_back");
    assert_eq!(r["decision"]["origin"], "admin");
    assert_eq!(r["canary"]["weight"], 0);
    let seen = generations(&canary).len();
    for i in 0..6 {
        post(&url, None, &chat(i)).await;
    }
    assert_eq!(generations(&canary).len(), seen);
    let r = admin(&gw, Method::POST, "/rollouts/qwen3/clear", Value::Null)
        .await
        .json();
    assert_eq!(r["decision"]["phase"], "canary");
    assert_eq!(r["canary"]["weight"], 50);
    let r = admin(&gw, Method::POST, "/rollouts/qwen3/promote", Value::Null)
        .await
        .json();
    assert_eq!(r["decision"]["phase"], "promoted");
    assert_eq!(r["stable"]["weight"], 0);
    let seen = generations(&stable).len();
    for i in 0..6 {
        let reply = post(&url, None, &chat(i)).await;
        assert_eq!(reply.headers["x-kvgate-pool"], "canary");
    }
    assert_eq!(generations(&stable).len(), seen);
}

/// Two gateway replicas sharing one real redis-server (keys under `prefix`), in front of a
/// healthy stable pool and a canary whose engine aborts every request, weights 50/50. The
/// Redis server and the engines live as long as the returned handles.
struct TwoReplicas {
    /// The Redis (a node or a cluster), alive as long as the replicas.
    _redis: Box<dyn std::any::Any + Send>,
    _stable: RunningSim,
    canary: RunningSim,
    a: RunningGateway,
    b: RunningGateway,
}

async fn two_replicas_over_a_failing_canary(prefix: &str) -> TwoReplicas {
    let redis = support_redis::RedisServer::start();
    let at = format!("redis_url = \"{}\"", redis.url());
    two_replicas_over_a_failing_canary_at(&at, prefix, Box::new(redis)).await
}

/// [`two_replicas_over_a_failing_canary`] sharing the Redis `at` names (`redis_url = …`,
/// `redis_cluster = […]`), kept alive by `redis`.
async fn two_replicas_over_a_failing_canary_at(
    at: &str,
    prefix: &str,
    redis: Box<dyn std::any::Any + Send>,
) -> TwoReplicas {
    let stable = healthy().await;
    let canary = engine(
        SimRole::Unified,
        SimFault::AbortNoStatus,
        40960,
        WINDOW as usize,
    )
    .await;
    let limits = format!("\n[limits]\nbackend = \"redis\"\n{at}\nkey_prefix = \"{prefix}\"\n");
    let config = canary_config(&stable, &canary, (50, 50)) + &limits;
    TwoReplicas {
        a: gateway(&config).await,
        b: gateway(&config).await,
        _redis: redis,
        _stable: stable,
        canary,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_rollback_through_redis() {
    share_a_rollback(two_replicas_over_a_failing_canary("kvgate-rollout-test").await).await;
}

/// The same through a 3-primary Redis Cluster (issue 39).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_rollback_through_a_redis_cluster() {
    if !support_redis::topology::available() {
        return;
    }
    let cluster = tokio::task::spawn_blocking(support_redis::topology::RedisCluster::start)
        .await
        .expect("start the cluster");
    let at = format!("redis_cluster = {}", cluster.urls_toml());
    let replicas =
        two_replicas_over_a_failing_canary_at(&at, "kvgate-rollout-cluster", Box::new(cluster))
            .await;
    share_a_rollback(replicas).await;
}

async fn share_a_rollback(replicas: TwoReplicas) {
    let TwoReplicas {
        _redis,
        _stable,
        canary,
        a,
        b,
    } = replicas;

    // Only replica A sees the canary fail; B decides nothing of its own...
    let mut sent = 0;
    while generations(&canary).len() < MIN_REQUESTS as usize {
        traffic(&a, sent, 1).await;
        sent += 1;
    }
    let ra = until_phase(&a, "rolled_back").await;
    assert_eq!(ra["decision"]["origin"], "automatic");
    // ...yet holds A's decision within its sync interval, and sends the canary nothing.
    let rb = until_phase(&b, "rolled_back").await;
    assert_eq!(rb["canary"]["weight"], 0);
    assert_eq!(rb["decision"]["breach"], ra["decision"]["breach"]);
    assert!(
        rb["decision"]["origin"]
            .as_str()
            .is_some_and(|o| o.starts_with("replica ")),
        "{rb:#}"
    );
    assert_eq!(rb["canary"]["rates"]["requests"], 0);
    let seen = generations(&canary).len();
    assert_eq!(traffic(&b, 1000, 12).await, 0);
    assert_eq!(generations(&canary).len(), seen);

    // Clearing on one replica clears it for both.
    admin(&b, Method::POST, "/rollouts/qwen3/clear", Value::Null).await;
    let ra = until_phase(&a, "canary").await;
    assert_eq!(ra["canary"]["weight"], 50);
}

/// A decision adopted through Redis does to the adopting replica's window what it did on
/// the replica that took it: a `clear` sent to A makes B forget the failed canary requests
/// it counted too, or B's next evaluation rolls the canary back again for the whole cluster.
/// Rollback and promote keep the window on both, and B follows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_adopted_through_redis_starts_a_fresh_window_on_the_adopting_replica() {
    let TwoReplicas {
        _redis,
        _stable,
        canary,
        a,
        b,
    } = two_replicas_over_a_failing_canary("kvgate-rollout-window-test").await;

    // Replica B counts the failing canary and rolls it back; A adopts that.
    let mut sent = 0;
    while generations(&canary).len() < MIN_REQUESTS as usize {
        traffic(&b, sent, 1).await;
        sent += 1;
    }
    let rb = until_phase(&b, "rolled_back").await;
    assert_eq!(rb["decision"]["origin"], "automatic");
    let failed_on_b = rb["canary"]["rates"]["requests"].as_u64().unwrap_or(0);
    assert!(failed_on_b >= MIN_REQUESTS, "{rb:#}");
    until_phase(&a, "rolled_back").await;

    // The canary was fixed: `clear` goes to A only.
    let ra = admin(&a, Method::POST, "/rollouts/qwen3/clear", Value::Null)
        .await
        .json();
    assert_eq!(ra["decision"]["phase"], "canary");
    assert_eq!(ra["canary"]["rates"]["requests"], 0, "{ra:#}");
    // B adopts it, and its canary window is as fresh as A's.
    let rb = until_phase(&b, "canary").await;
    assert_eq!(rb["canary"]["weight"], 50, "{rb:#}");
    assert_eq!(
        rb["canary"]["rates"]["requests"], 0,
        "B kept its {failed_on_b} failed canary requests after adopting the clear: {rb:#}"
    );
    assert_eq!(rb["canary"]["rates"]["engine_errors"], 0, "{rb:#}");
    assert_eq!(rb["decision"]["window_epoch"], ra["decision"]["epoch"]);

    // Two sync rounds (each evaluates) and a served request on B decide nothing: the
    // canary stays in for the whole cluster.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let url = format!("http://{}/v1/chat/completions", b.data_addr());
    let mut served = false;
    for i in 0..8 {
        let reply = post(&url, None, &chat(2000 + i)).await;
        if reply.status == StatusCode::OK {
            served = true;
            break;
        }
    }
    assert!(served, "no request on B was served");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for (name, gw) in [("A", &a), ("B", &b)] {
        let r = rollout(gw).await;
        assert_eq!(
            r["decision"]["phase"], "canary",
            "{name} rolled back again: {r:#}"
        );
        assert_eq!(r["canary"]["weight"], 50, "{name}: {r:#}");
    }

    // Rollback and promote from A: B follows, its window kept, as A keeps its own.
    let before = rollout(&b).await["canary"]["rates"]["requests"].clone();
    admin(
        &a,
        Method::POST,
        "/rollouts/qwen3/rollback",
        json!({"reason": "window test"}),
    )
    .await;
    let rb = until_phase(&b, "rolled_back").await;
    assert_eq!(rb["canary"]["weight"], 0);
    assert_eq!(rb["canary"]["rates"]["requests"], before, "{rb:#}");
    admin(&a, Method::POST, "/rollouts/qwen3/promote", Value::Null).await;
    let rb = until_phase(&b, "promoted").await;
    assert_eq!(rb["stable"]["weight"], 0);
    assert_eq!(rb["canary"]["rates"]["requests"], before, "{rb:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_stick_to_one_pool_and_raising_the_canary_only_moves_tenants_onto_it() {
    let stable = healthy().await;
    let canary = healthy().await;
    let keys: Vec<String> = (0..12).map(|i| format!("sticky-tenant-key-{i}")).collect();
    let mut tenants = String::new();
    for (i, key) in keys.iter().enumerate() {
        tenants.push('\n');
        tenants.push_str(&tenant_table(&format!("team-{i}"), key));
    }
    let gw = gateway(&(canary_config(&stable, &canary, (50, 50)) + &tenants)).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let pools_of = |gw_url: String, keys: Vec<String>| async move {
        let mut out = Vec::new();
        for key in &keys {
            let mut seen = Vec::new();
            for i in 0..4 {
                let reply = post(&gw_url, Some(key), &chat(i)).await;
                assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
                seen.push(reply.headers["x-kvgate-pool"].to_str().unwrap().to_owned());
            }
            seen.dedup();
            assert_eq!(seen.len(), 1, "tenant {key} moved between pools: {seen:?}");
            out.push(seen.remove(0));
        }
        out
    };
    let before = pools_of(url.clone(), keys.clone()).await;
    assert!(before.iter().any(|p| p == "stable") && before.iter().any(|p| p == "canary"));

    let reply = admin(
        &gw,
        Method::POST,
        "/pools/canary/weight",
        json!({"weight": 300}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let after = pools_of(url.clone(), keys.clone()).await;
    for (b, a) in before.iter().zip(&after) {
        if b == "canary" {
            assert_eq!(a, "canary", "raising the canary moved a tenant off it");
        }
    }
    assert!(
        after.iter().filter(|p| *p == "canary").count()
            >= before.iter().filter(|p| *p == "canary").count()
    );

    // A tenant allowed to choose picks the canary by hand; others may not.
    let config = canary_config(&stable, &canary, (100, 0))
        + "\n"
        + &tenant_table("tester", "chooser-key")
        + "choose_pool = true\n";
    let gw = gateway(&config).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let pick = [("x-kvgate-pool", "canary")];
    let reply = post_with(&url, Some("chooser-key"), &pick, &chat(0)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.headers["x-kvgate-pool"], "canary");
    let reply = post_with(&url, Some(KEY), &pick, &chat(0)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(error_code(&reply), "pool_choice_not_allowed");
    let bad = [("x-kvgate-pool", "nope")];
    let reply = post_with(&url, Some("chooser-key"), &bad, &chat(0)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&reply), "unknown_pool");
}

/// Send healthy chats (numbered from `i`) until the canary engine has seen `n`; the next number.
async fn until_canary_saw(url: &str, canary: &RunningSim, n: usize, mut i: usize) -> usize {
    while generations(canary).len() < n {
        assert_eq!(post(url, None, &chat(i)).await.status, StatusCode::OK);
        i += 1;
    }
    i
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_canary_is_promoted_in_configured_steps() {
    let stable = healthy().await;
    let canary = healthy().await;
    let config = canary_config(&stable, &canary, (50, 50))
        + "\n[rollouts.promotion]\nsteps = [75, 100]\nclean_window = \"1s\"\n";
    let gw = gateway(&config).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let mut i = 0;
    // Clean windows pass, but below the minimum sample nothing is promoted either.
    i = until_canary_saw(&url, &canary, MIN_REQUESTS as usize - 2, i).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let r = rollout(&gw).await;
    assert_eq!(r["decision"]["phase"], "canary", "{r:#}");
    assert_eq!(
        r["canary"]["weight"], 50,
        "promoted on a small sample: {r:#}"
    );
    i = until_canary_saw(&url, &canary, MIN_REQUESTS as usize, i).await;

    // First step: 75 % of the model's traffic on the canary, still a canary.
    let deadline = Instant::now() + Duration::from_secs(15);
    let stepped = loop {
        let r = rollout(&gw).await;
        if r["decision"]["step"] == 0 {
            break r;
        }
        assert_eq!(
            r["decision"]["phase"], "canary",
            "promoted without the first step: {r:#}"
        );
        assert!(
            Instant::now() < deadline,
            "never took the first step: {r:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stepped["decision"]["phase"], "canary");
    assert!(
        gw.audit()
            .recent()
            .iter()
            .any(|l| l["event"] == "rollout_step" && l["step"] == 0),
        "an audit line for the step"
    );
    let (s, c) = (
        stepped["stable"]["weight"].as_u64().unwrap_or_default(),
        stepped["canary"]["weight"].as_u64().unwrap_or_default(),
    );
    assert_eq!(c * 100 / (s + c), 75, "{stepped:#}");

    // The last step (100) after another clean window: promoted, the stable pool idle.
    let r = until_phase(&gw, "promoted").await;
    assert_eq!(r["stable"]["weight"], 0, "{r:#}");
    assert!(gw
        .audit()
        .recent()
        .iter()
        .any(|l| l["event"] == "rollout_promoted"));
    let before = generations(&stable).len();
    for j in 0..6 {
        let reply = post(&url, None, &chat(i + j)).await;
        assert_eq!(reply.headers["x-kvgate-pool"], "canary");
    }
    assert_eq!(generations(&stable).len(), before);
}
