//! Each pool's gateway queue (issue 30) on the admin port: `GET /pools` shows a `"queue"`
//! object per pool — length, bound, waiting requests by class and by tenant, the oldest
//! wait, the recent drain rate and the `Retry-After` a refusal would carry — with the
//! defaults of `[scheduling]` and with a configured `max_queued`.

mod support;

use http::{Method, StatusCode};
use serde_json::{json, Value};

use kvgate_sim::{SimFault, SimRole};
use support::*;

const WINDOW: u64 = 8192;
const KV: usize = 4096;
const TOKEN_ENV: &str = "KVGATE_QUEUE_ADMIN_TEST_TOKEN";
const TOKEN: &str = "queue-admin-test-token";

/// The standard config with an admin token, pools `a` and `b` on `worker`, and `extra`
/// (a `[scheduling]` table, say) before the audit table.
fn config(worker: &str, extra: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    let mut pools = unified_pool("a", &[worker.to_owned()]);
    pools.push_str(&unified_pool("b", &[worker.to_owned()]));
    config_with_pools(WINDOW, &pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace("[audit]\n", &format!("{extra}\n[audit]\n"))
}

/// `GET /pools`: each pool's name and its queue object.
async fn pool_queues(gw: &kvgate::runtime::RunningGateway) -> Vec<(String, Value)> {
    let reply = admin(gw, Method::GET, "/pools", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let pools = reply.json();
    pools["pools"]
        .as_array()
        .unwrap_or_else(|| panic!("no pools: {pools}"))
        .iter()
        .map(|p| {
            (
                p["pool"].as_str().expect("pool name").to_owned(),
                p["queue"].clone(),
            )
        })
        .collect()
}

/// An empty queue bounded by `max`: nothing waits, nothing drained, the 5 s hint.
fn empty(max: u64) -> Value {
    json!({
        "length": 0,
        "max_queued": max,
        "by_class": {"critical": 0, "standard": 0, "sheddable": 0},
        "by_tenant": {},
        "oldest_wait_seconds": 0.0,
        "drain_per_second": 0.0,
        "retry_after_seconds": 5,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_show_an_empty_queue_with_the_default_bound() {
    let sim = engine(SimRole::Unified, SimFault::None, KV, WINDOW as usize).await;
    let gw = gateway(&config(&worker(&sim, None), "")).await;
    let queues = pool_queues(&gw).await;
    assert_eq!(queues.len(), 2, "{queues:?}");
    for (pool, queue) in &queues {
        assert_eq!(queue, &empty(256), "pool {pool}");
    }
    // A served request passes no queue while there is room: still empty.
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let body = json!({"model": "qwen3", "max_tokens": 2,
        "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&url, Some(KEY), &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    for (pool, queue) in pool_queues(&gw).await {
        assert_eq!(queue["length"], 0, "pool {pool}: {queue}");
        assert_eq!(queue["max_queued"], 256, "pool {pool}: {queue}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_max_queued_bounds_every_pools_queue() {
    let sim = engine(SimRole::Unified, SimFault::None, KV, WINDOW as usize).await;
    let gw = gateway(&config(
        &worker(&sim, None),
        "[scheduling]\nmax_queued = 8\n",
    ))
    .await;
    let queues = pool_queues(&gw).await;
    assert_eq!(queues.len(), 2, "{queues:?}");
    for (pool, queue) in &queues {
        assert_eq!(queue, &empty(8), "pool {pool}");
    }
    // The status page shows the same queue per pool.
    let page = admin(&gw, Method::GET, "/status", None).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.text();
    for (pool, _) in &queues {
        let open = format!("<tr data-queue=\"{pool}\"");
        let start = html
            .find(&open)
            .unwrap_or_else(|| panic!("no {open}: {html}"));
        let tr = &html[start..start + html[start..].find("</tr>").expect("row end")];
        assert!(tr.contains("data-field=\"queue_length\">0<"), "{tr}");
        assert!(tr.contains("data-field=\"max_queued\">8<"), "{tr}");
    }
    gw.shutdown().await;
}
