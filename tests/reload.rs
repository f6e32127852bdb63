//! Reload of the whole config (`POST /reload`, SIGHUP): pools and workers added, changed
//! and removed change routing for new requests while a stream that started before finishes
//! on the old view; a worker added by a reload serves only once its capacity was
//! discovered; an invalid config is refused whole and the old one keeps serving.

mod support;

use http::{Method, StatusCode};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

use kvgate::runtime::{Gateway, RunningGateway};
use kvgate_sim::{RunningSim, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const TOKEN_ENV: &str = "KVGATE_RELOAD_TEST_TOKEN";
const TOKEN: &str = "reload-test-token";

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The standard test config with `pools`, an admin token and a tenant that may choose its
/// pool (`x-kvgate-pool`), written to `path` with absolute tokenizer paths.
fn write_config(path: &Path, pools: &str) {
    std::env::set_var(TOKEN_ENV, TOKEN);
    let text = config_with_pools(WINDOW, pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace("name = \"t1\"\n", "name = \"t1\"\nchoose_pool = true\n")
        .replace(
            "\"tokenizers/",
            &format!("\"{}/", repo().join("config/tokenizers").display()),
        );
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn pool(name: &str, workers: &[String]) -> String {
    unified_pool(name, workers)
}

async fn start(path: &Path) -> RunningGateway {
    let config = kvgate::config::Config::load(path).unwrap();
    Gateway::new(config)
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap()
}

async fn reload(gw: &RunningGateway) -> Reply {
    admin(gw, Method::POST, "/reload", Some(TOKEN)).await
}

fn chat(stream: bool, max_tokens: u32) -> Value {
    json!({"model": "qwen3", "max_tokens": max_tokens, "stream": stream,
           "messages": [{"role": "user", "content": "tell me a long story"}]})
}

/// A whole chat answer from pool `pool`.
async fn chat_in(gw: &RunningGateway, pool: &str) -> Reply {
    post_with(
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(KEY),
        &[("x-kvgate-pool", pool)],
        &chat(false, 4),
    )
    .await
}

fn served_by(reply: &Reply) -> String {
    reply
        .headers
        .get("x-kvgate-pool")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// A worker entry without `kv_tokens`: its capacity must be discovered.
fn discovered(engine: &RunningSim) -> String {
    worker(engine, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_adds_a_pool_and_removes_a_worker_changes_routing_without_dropping_a_stream()
{
    let dir = temp_dir("reload-routing");
    let path = dir.join("kvgate.toml");
    let a = slow_engine(WINDOW as usize, 40).await;
    let b = slow_engine(WINDOW as usize, 40).await;
    let c = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    write_config(&path, &pool("p1", &[discovered(&a), discovered(&b)]));
    let gw = start(&path).await;

    // p2 does not exist yet.
    let before = chat_in(&gw, "p2").await;
    assert_ne!(before.status, StatusCode::OK, "{}", before.text());

    // A stream (40 ms a token) starts on one of p1's workers.
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let stream = tokio::spawn(async move { post(&url, Some(KEY), &chat(true, 60)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let (on, other) = loop {
        if !generations(&a).is_empty() {
            break (&a, &b);
        }
        if !generations(&b).is_empty() {
            break (&b, &a);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

    // The stream's worker leaves p1, and p2 arrives with a worker whose capacity is not
    // configured.
    let old_p1 = gw.fleet().pool("p1").unwrap().clone();
    write_config(
        &path,
        &format!(
            "{}\n{}",
            pool("p1", &[discovered(other)]),
            pool("p2", &[discovered(&c)])
        ),
    );
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert!(
        !stream.is_finished(),
        "the reload happened while the stream ran"
    );
    let report = answer.json();
    assert_eq!(report["generation"], 2, "{report}");
    assert_eq!(report["pools_rebuilt"], json!(["p1", "p2"]), "{report}");
    assert_eq!(report["pools_removed"], json!([]), "{report}");

    // New requests follow the new config at once: p2's worker was discovered before the
    // reload answered, and the removed worker gets nothing new.
    let sent_to_removed = generations(on).len();
    for _ in 0..4 {
        let reply = chat_in(&gw, "p2").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(served_by(&reply), "p2");
        let reply = chat_in(&gw, "p1").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_eq!(served_by(&reply), "p1");
    }
    assert_eq!(generations(&c).len(), 4);
    assert_eq!(
        generations(on).len(),
        sent_to_removed,
        "a removed worker gets no new request"
    );
    // Nor from the previous generation (requests still queued there): it is drained there,
    // the kept one is not.
    let on_port = on.http_addr.port();
    for w in old_p1.all_workers() {
        let gone = w.authority.ends_with(&format!(":{on_port}"));
        assert_eq!(w.is_draining(), gone, "{}", w.authority);
    }
    assert!(generations(other).len() >= 4);

    // The stream that started before the reload finished whole on the removed worker.
    let streamed = stream.await.unwrap();
    assert_eq!(streamed.status, StatusCode::OK, "{}", streamed.text());
    let events = streamed.sse_data();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        streamed.text()
    );
    let finish = events
        .iter()
        .rev()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .find_map(|e| e["choices"][0]["finish_reason"].as_str().map(str::to_owned));
    assert!(
        matches!(finish.as_deref(), Some("stop" | "length")),
        "the stream ended as a success: {}",
        streamed.text()
    );

    // The admin port shows the new pools only.
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let names: Vec<&str> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pool"].as_str())
        .collect();
    assert_eq!(names, ["p1", "p2"], "{pools}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_reload_is_refused_whole_and_the_running_config_keeps_serving() {
    let dir = temp_dir("reload-invalid");
    let path = dir.join("kvgate.toml");
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    write_config(&path, &pool("p1", &[worker(&a, None)]));
    let gw = start(&path).await;

    // Each of these is refused, names what is wrong, and changes nothing: p1 keeps
    // serving and p2 never appears.
    let p2 = pool("p2", &[worker(&b, None)]);
    let bad = [
        (
            format!(
                "{}\n{}",
                pool("p1", &[worker(&a, None)]),
                p2.replace("qwen3", "unknown-model")
            ),
            "pools[1].model",
        ),
        (
            format!(
                "{}\n{}",
                pool("p1", &[worker(&a, None)]),
                p2.replace("unified", "sideways")
            ),
            "mode",
        ),
        (
            format!("{}\n{}\nbogus_key = 1", pool("p1", &[worker(&a, None)]), p2),
            "bogus_key",
        ),
    ];
    for (pools, named) in bad {
        write_config(&path, &pools);
        let answer = reload(&gw).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.text());
        assert_eq!(error_code(&answer), "invalid_config");
        assert!(
            error_message(&answer).contains(named),
            "the error names `{named}`: {}",
            answer.text()
        );
        let reply = chat_in(&gw, "p1").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        assert_ne!(chat_in(&gw, "p2").await.status, StatusCode::OK);
    }
    assert!(generations(&b).is_empty());

    // A file that cannot be read at all: the same.
    std::fs::write(&path, "this is not toml = [").unwrap();
    assert_eq!(reload(&gw).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(chat_in(&gw, "p1").await.status, StatusCode::OK);

    // Fixed: the next reload takes it.
    write_config(
        &path,
        &format!("{}\n{}", pool("p1", &[worker(&a, None)]), p2),
    );
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["generation"], 2);
    assert_eq!(
        answer.json()["pools_kept"],
        json!(["p1"]),
        "{}",
        answer.text()
    );
    let reply = chat_in(&gw, "p2").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(generations(&b).len(), 1);

    let metrics = kvgate::metrics::handle().render();
    assert!(
        metrics.lines().any(|l| l.starts_with("kvgate_config_reloads_total")
            && l.contains("result=\"error\"")),
        "{metrics}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_pool_keeps_its_state_and_sections_read_at_start_are_reported() {
    let dir = temp_dir("reload-state");
    let path = dir.join("kvgate.toml");
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    write_config(&path, &pool("p1", &[worker(&a, None)]));
    let gw = start(&path).await;
    let before = gw.fleet().pool("p1").unwrap().clone();
    before.set_weight(7);

    // Only [server] changed: the pool is the same object (its admin weight, workers'
    // capacity and health go on), and the answer says a restart is needed for [server].
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("drain_timeout = \"10s\"", "drain_timeout = \"11s\"");
    std::fs::write(&path, text).unwrap();
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["restart_required"], json!(["server"]));
    assert_eq!(answer.json()["pools_kept"], json!(["p1"]));
    let after = gw.fleet().pool("p1").unwrap().clone();
    assert!(std::sync::Arc::ptr_eq(&before, &after));
    assert_eq!(after.weight(), 7);
    assert_eq!(chat_in(&gw, "p1").await.status, StatusCode::OK);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_gateway_reloads_a_new_pool_whose_capacity_is_discovered() {
    // `admission.strict` refuses a reload that brings a window larger than a KV pool; a
    // new worker without `kv_tokens` is not that: its capacity is discovered first.
    let dir = temp_dir("reload-strict");
    let path = dir.join("kvgate.toml");
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let small = engine(SimRole::Unified, SimFault::None, 8192, WINDOW as usize).await;
    let strict = |pools: &str| format!("{pools}\n[admission]\nstrict = true\n");
    write_config(&path, &strict(&pool("p1", &[discovered(&a)])));
    let gw = start(&path).await;

    write_config(
        &path,
        &strict(&format!(
            "{}\n{}",
            pool("p1", &[discovered(&a)]),
            pool("p2", &[discovered(&b)])
        )),
    );
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(chat_in(&gw, "p2").await.status, StatusCode::OK);

    // A pool whose discovered KV is smaller than the window is the mismatch strict refuses.
    write_config(
        &path,
        &strict(&format!(
            "{}\n{}",
            pool("p1", &[discovered(&a)]),
            pool("p3", &[discovered(&small)])
        )),
    );
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.text());
    assert!(error_message(&answer).contains("p3"), "{}", answer.text());
    assert_eq!(
        chat_in(&gw, "p2").await.status,
        StatusCode::OK,
        "the running config stays"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_rebuilt_over_kept_pools_starts_again_from_the_configured_weights() {
    let dir = temp_dir("reload-rollout");
    let path = dir.join("kvgate.toml");
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let with_rollout = |min_requests: u32| {
        format!(
            "{}\n{}\n[[rollouts]]\nmodel = \"qwen3\"\nstable = \"stable\"\ncanary = \"canary\"\nmin_requests = {min_requests}\n",
            pool("stable", &[worker(&a, None)]),
            pool("canary", &[worker(&b, None)]).replace("mode = \"unified\"", "mode = \"unified\"\nweight = 20"),
        )
    };
    write_config(&path, &with_rollout(20));
    let gw = start(&path).await;
    let old = gw.rollouts().of_model("qwen3").unwrap().clone();
    old.roll_back("test");
    let canary = gw.fleet().pool("canary").unwrap().clone();
    assert_eq!(canary.weight(), 0, "rolled back");

    // Only the rollout's settings change: both pools are kept, the rollout starts again.
    write_config(&path, &with_rollout(30));
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["pools_kept"], json!(["stable", "canary"]));
    let kept = gw.fleet().pool("canary").unwrap().clone();
    assert!(std::sync::Arc::ptr_eq(&canary, &kept));
    assert_eq!(kept.weight(), 20, "the canary is sampled again");
    let new = gw.rollouts().of_model("qwen3").unwrap().clone();
    assert!(!std::sync::Arc::ptr_eq(&old, &new));
    assert_eq!(new.decision().phase, kvgate::rollout::Phase::Canary);

    // The replaced rollout decides nothing more, whatever requests still report to it.
    old.roll_back("late");
    old.evaluate(std::time::Instant::now());
    assert_eq!(kept.weight(), 20);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_rebuilt_with_other_workers_only_keeps_its_weight_window_and_rollout() {
    // What a DNS change does to a pool (issue 39), done by the file: only the canary's
    // workers change. It is rebuilt (new workers), but it is the same pool: an autoscaled
    // canary must not restart its rollout or forget a rollback.
    let dir = temp_dir("reload-workers-only");
    let path = dir.join("kvgate.toml");
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let c = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let with_canary = |workers: &[String]| {
        format!(
            "{}\n{}\n[[rollouts]]\nmodel = \"qwen3\"\nstable = \"stable\"\ncanary = \"canary\"\nmin_requests = 20\n",
            pool("stable", &[worker(&a, None)]),
            pool("canary", workers).replace("mode = \"unified\"", "mode = \"unified\"\nweight = 20"),
        )
    };
    write_config(&path, &with_canary(&[worker(&b, None)]));
    let gw = start(&path).await;
    let old = gw.rollouts().of_model("qwen3").unwrap().clone();
    old.roll_back("test");
    let canary = gw.fleet().pool("canary").unwrap().clone();
    assert_eq!(canary.weight(), 0, "rolled back");
    gw.fleet().pool("stable").unwrap().set_weight(90);

    // The canary gets a second engine; nothing else changes.
    write_config(&path, &with_canary(&[worker(&b, None), worker(&c, None)]));
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.json()["pools_rebuilt"], json!(["canary"]));
    let rebuilt = gw.fleet().pool("canary").unwrap().clone();
    assert!(
        !std::sync::Arc::ptr_eq(&canary, &rebuilt),
        "new workers: a new pool object"
    );
    assert_eq!(rebuilt.all_workers().count(), 2);
    assert_eq!(rebuilt.weight(), 0, "the rollback holds");
    assert_eq!(rebuilt.lineage, canary.lineage);
    assert!(std::sync::Arc::ptr_eq(&canary.signals, &rebuilt.signals));
    let new = gw.rollouts().of_model("qwen3").unwrap().clone();
    assert!(
        !std::sync::Arc::ptr_eq(&old, &new),
        "rebound to the rebuilt pool"
    );
    assert_eq!(new.decision().phase, old.decision().phase);
    assert_eq!(new.decision().epoch, old.decision().epoch);
    assert_eq!(gw.fleet().pool("stable").unwrap().weight(), 90);
    // Changing a setting of the pool itself makes a new pool, which starts from the file.
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("weight = 20", "weight = 25");
    std::fs::write(&path, text).unwrap();
    let answer = reload(&gw).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let fresh = gw.fleet().pool("canary").unwrap().clone();
    assert_ne!(fresh.lineage, canary.lineage);
    assert_eq!(fresh.weight(), 25);
    gw.shutdown().await;
}

/// An engine running at most two requests at once, each answer taking 1.5 s to start.
async fn two_slot_engine() -> RunningSim {
    engine_with(kvgate_sim::SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: WINDOW as usize,
        context_length: WINDOW as usize,
        first_token_latency: Duration::from_millis(1500),
        max_running_requests: std::num::NonZeroUsize::new(2),
        ..kvgate_sim::SimConfig::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_rebuilt_by_a_reload_keeps_counting_what_runs_on_its_engines() {
    let engine = two_slot_engine().await;
    let dir = temp_dir("reload-carry");
    let path = dir.join("kvgate.toml");
    let entry = format!(
        "{}max_running = 2\n",
        pool("p", &[worker(&engine, Some(WINDOW))])
    );
    write_config(&path, &entry);
    let gw = std::sync::Arc::new(start(&path).await);
    let send = |gw: &std::sync::Arc<RunningGateway>| {
        let gw = gw.clone();
        tokio::spawn(async move { chat_in(&gw, "p").await })
    };
    let running = [send(&gw), send(&gw)];
    for _ in 0..1000 {
        if gw.fleet().workers().map(|w| w.outstanding()).sum::<usize>() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The pool's entry changes (a pool cap added): the reload builds it afresh.
    write_config(&path, &format!("{entry}max_in_flight = 100\n"));
    let reloaded = reload(&gw).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.text());
    let rebuilt = gw.fleet().pool("p").cloned().expect("pool p");
    assert_eq!(
        rebuilt
            .all_workers()
            .map(|w| w.outstanding())
            .sum::<usize>(),
        2,
        "the rebuilt pool counts the two requests still running"
    );
    // A third request waits in kvgate's queue, not in the engine's.
    let third = send(&gw);
    for _ in 0..1000 {
        if rebuilt.queue.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(rebuilt.queue.len(), 1, "the third request queues in kvgate");
    for r in running {
        assert_eq!(r.await.expect("request").status, StatusCode::OK);
    }
    assert_eq!(third.await.expect("request").status, StatusCode::OK);
    let stats = engine.engine.stats();
    assert_eq!(stats.peak_running, 2, "{stats:?}");
    assert_eq!(
        stats.queued, 0,
        "never more in flight than the engine runs: {stats:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
