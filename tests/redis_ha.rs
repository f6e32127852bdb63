//! Redis Cluster and Sentinel (issue 39, items 1 and 2), against real servers the tests
//! start: a 3-primary cluster and a primary + replica + 3 sentinels. Two in-process gateway
//! replicas share one tenant's limits through each; every key they leave carries an expiry
//! (streams are capped instead). Skipped, loudly, when `redis-server`/`redis-cli` are not
//! installed (CI installs them: `.ci/run`).

mod support;
mod support_redis;

use serde_json::json;
use support::*;
use support_redis::topology::{self, RedisCluster};

use kvgate::runtime::RunningGateway;
use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

fn config(pools: &str, limits: &str, rpm: u32) -> String {
    format!(
        "[audit]\nsink = \"none\"\n[upstream]\ndiscovery_interval = \"1h\"\n{limits}\n{}{pools}\n{}requests_per_minute = {rpm}\n",
        model_table("qwen3", WINDOW),
        tenant_table("metered", "sk-metered"),
    )
}

fn small() -> serde_json::Value {
    json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})
}

/// Send `n` requests at once, alternating between `gateways`; `(admitted, limited)`.
async fn burst(gateways: &[&RunningGateway], n: usize) -> (usize, usize) {
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = format!("http://{}/generate", gateways[i % gateways.len()].data_addr());
        tasks.push(tokio::spawn(async move {
            post(&url, Some("sk-metered"), &small()).await.status.as_u16()
        }));
    }
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        match t.await.expect("request task") {
            200 => ok += 1,
            429 => limited += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (ok, limited)
}

/// A node of `cluster` that does not hold `key`'s slot (it answers MOVED for it).
fn node_without(cluster: &RedisCluster, key: &str) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| n.cli(&["GET", key]).concat().contains("MOVED"))
        .expect("some node answers MOVED")
}

#[tokio::test]
async fn limits_hold_through_a_cluster() {
    if !topology::available() {
        return;
    }
    let cluster = RedisCluster::start();
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    // What an operator tried first: one node of the cluster as `redis_url`.
    let node = node_without(&cluster, "kvgate-ha:{metered}:req");
    let limits = format!(
        "[limits]\nbackend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"kvgate-ha\"\nfailure_policy = \"fail_open\"\n",
        cluster.nodes[node].url()
    );
    let text = config(&unified_pool("u", &[worker(&engine, None)]), &limits, 120);
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    let (ok, limited) = burst(&[&a, &b], 300).await;
    assert!(
        (114..=126).contains(&ok),
        "admitted {ok} of 300 (limited {limited}) against a limit of 120 a minute through the cluster"
    );
    for n in &cluster.nodes {
        topology::assert_every_key_expires(n, 1100);
    }
    a.shutdown().await;
    b.shutdown().await;
}
