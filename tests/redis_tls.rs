//! TLS to Redis (issue 39: "Cluster and Sentinel with TLS and auth as today"), against a
//! real `redis-server` speaking TLS only, with certificates the test makes: limits shared
//! by two replicas through a `rediss://` node trusted by a private CA; a node that requires
//! a client certificate, with and without one; a CA that did not sign the server's
//! certificate. Skipped, loudly, when `redis-server` lacks TLS (Debian's has it).

mod support;
mod support_redis;

use serde_json::json;
use support::*;
use support_redis::tls::{self, TlsCluster, TlsFiles, TlsNode, TlsSentinelSet};

use kvgate::runtime::RunningGateway;
use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;
const RPM: u32 = 20;

fn config(pools: &str, limits: &str) -> String {
    format!(
        "[audit]\nsink = \"none\"\n[upstream]\ndiscovery_interval = \"1h\"\n{limits}\n{}{pools}\n{}requests_per_minute = {RPM}\n",
        model_table("qwen3", WINDOW),
        tenant_table("metered", "sk-metered"),
    )
}

/// `[limits]` for the TLS node at `url`; `tls` is the inline `redis_tls` table.
fn limits(url: &str, tls: &str, policy: &str) -> String {
    format!(
        "[limits]\nbackend = \"redis\"\nredis_url = \"{url}\"\nredis_tls = {tls}\nkey_prefix = \"kvgate-tls\"\nfailure_policy = \"{policy}\"\n"
    )
}

fn small() -> serde_json::Value {
    json!({"text": "hi", "sampling_params": {"max_new_tokens": 2}})
}

/// Send `n` requests at once, alternating between `gateways`; the statuses and codes.
async fn burst(gateways: &[&RunningGateway], n: usize) -> Vec<(u16, String)> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = format!(
            "http://{}/generate",
            gateways[i % gateways.len()].data_addr()
        );
        tasks.push(tokio::spawn(async move {
            let r = post(&url, Some("sk-metered"), &small()).await;
            let code = if r.status == 200 {
                String::new()
            } else {
                error_code(&r)
            };
            (r.status.as_u16(), code)
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request task"));
    }
    out
}

fn admitted(outcomes: &[(u16, String)]) -> usize {
    outcomes.iter().filter(|o| o.0 == 200).count()
}

/// A counter's value on `gw`'s `/metrics` (summed over label sets with `label`).
async fn counter(gw: &RunningGateway, name: &str, label: &str) -> f64 {
    let text = get(&format!("http://{}/metrics", gw.admin_addr()), None)
        .await
        .text();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn files(name: &str) -> TlsFiles {
    let dir = std::env::temp_dir().join(format!("kvgate-redis-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TlsFiles::generate(&dir)
}

fn toml_path(p: &std::path::Path) -> String {
    format!("\"{}\"", p.display())
}

/// Two replicas, one tenant at 20 a minute, 60 requests through a `rediss://` node whose
/// certificate a private CA (`redis_tls.ca_file`) signed: 20 admitted, as without TLS.
#[tokio::test]
async fn limits_hold_across_two_replicas_through_a_tls_node() {
    if !tls::available() {
        return;
    }
    let files = files("node");
    let node = tokio::task::spawn_blocking({
        let files = files.clone();
        move || TlsNode::start(&files, "n", false, &[])
    })
    .await
    .expect("start the TLS node");
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let tls = format!("{{ ca_file = {} }}", toml_path(&files.ca));
    let text = config(
        &unified_pool("u", &[worker(&engine, None)]),
        &limits(&node.url(), &tls, "fail_closed"),
    );
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    let started = std::time::Instant::now();
    let outcomes = burst(&[&a, &b], 3 * RPM as usize).await;
    let ok = admitted(&outcomes);
    eprintln!(
        "TLS node: admitted {ok} of {} against {RPM} a minute",
        outcomes.len()
    );
    assert!(
        (RPM as usize..=RPM as usize + refilled(started)).contains(&ok),
        "admitted {ok} of {} against {RPM} a minute through the TLS node: {outcomes:?}",
        outcomes.len()
    );
    assert!(
        outcomes
            .iter()
            .all(|o| o.0 == 200 || o.1 == "rate_limit_exceeded"),
        "every refusal is the limit, none is Redis lost: {outcomes:?}"
    );
    let keys = node.cli(&["--scan"]);
    assert!(
        keys.iter().any(|k| k == "kvgate-tls:{metered}:req"),
        "the bucket lives on the TLS node: {keys:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// `tls-auth-clients yes`: a replica with `cert_file`/`key_file` is served by the node's
/// limits; one without a client certificate is refused by Redis, which kvgate counts as
/// `tls`; it is not connected, so its failure policy decides (here fail closed: 429
/// `rate_limit_unavailable`).
#[tokio::test]
async fn a_node_that_requires_a_client_certificate() {
    if !tls::available() {
        return;
    }
    let files = files("mtls");
    let node = tokio::task::spawn_blocking({
        let files = files.clone();
        move || TlsNode::start(&files, "n", true, &[])
    })
    .await
    .expect("start the TLS node");
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pool = unified_pool("u", &[worker(&engine, None)]);
    let with_cert = format!(
        "{{ ca_file = {}, cert_file = {}, key_file = {} }}",
        toml_path(&files.ca),
        toml_path(&files.client_cert),
        toml_path(&files.client_key)
    );
    let a = gateway(&config(
        &pool,
        &limits(&node.url(), &with_cert, "fail_open"),
    ))
    .await;
    let started = std::time::Instant::now();
    let outcomes = burst(&[&a], 3 * RPM as usize).await;
    let ok = admitted(&outcomes);
    assert!(
        (RPM as usize..=RPM as usize + refilled(started)).contains(&ok),
        "with a client certificate: admitted {ok} of {} against {RPM}: {outcomes:?}",
        outcomes.len()
    );

    let without = format!("{{ ca_file = {} }}", toml_path(&files.ca));
    let b = gateway(&config(
        &pool,
        &limits(&node.url(), &without, "fail_closed"),
    ))
    .await;
    let outcomes = burst(&[&b], 10).await;
    eprintln!("TLS node without a client certificate: {outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o.0 == 429 && o.1 == "rate_limit_unavailable"),
        "without a client certificate nothing is admitted: {outcomes:?}"
    );
    let tls_problems = counter(&b, "kvgate_redis_problems_total", "reason=\"tls\"").await;
    assert!(tls_problems >= 1.0, "the refusal is counted as tls");
    a.shutdown().await;
    b.shutdown().await;
}

/// A `ca_file` that did not sign the node's certificate: the handshake fails on the
/// certificate, which is reported as `tls` (with the fix), not as Redis unreachable; the
/// store is not connected, so the failure policy decides (fail closed here).
#[tokio::test]
async fn a_wrong_ca_is_a_tls_problem_not_an_outage() {
    if !tls::available() {
        return;
    }
    let files = files("wrong-ca");
    let node = tokio::task::spawn_blocking({
        let files = files.clone();
        move || TlsNode::start(&files, "n", false, &[])
    })
    .await
    .expect("start the TLS node");
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let tls = format!("{{ ca_file = {} }}", toml_path(&files.other_ca));
    let text = config(
        &unified_pool("u", &[worker(&engine, None)]),
        &limits(&node.url(), &tls, "fail_closed"),
    );
    // The gateway starts (Redis problems never stop a start) and refuses limited tenants.
    let gw = gateway(&text).await;
    let outcomes = burst(&[&gw], 5).await;
    assert!(
        outcomes
            .iter()
            .all(|o| o.0 == 429 && o.1 == "rate_limit_unavailable"),
        "an untrusted Redis is not served unlimited: {outcomes:?}"
    );
    let tls_problems = counter(&gw, "kvgate_redis_problems_total", "reason=\"tls\"").await;
    assert!(tls_problems >= 1.0, "counted as tls");
    gw.shutdown().await;
    drop(node);
}

/// Two replicas through a Redis Cluster over TLS (`tls-cluster yes`): `rediss://` seeds, the
/// nodes found through them reached over TLS with the same CA.
#[tokio::test]
async fn limits_hold_through_a_tls_cluster() {
    if !tls::available() {
        return;
    }
    let files = files("cluster");
    let cluster = tokio::task::spawn_blocking({
        let files = files.clone();
        move || TlsCluster::start(&files)
    })
    .await
    .expect("start the TLS cluster");
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let limits = format!(
        "[limits]\nbackend = \"redis\"\nredis_cluster = {}\nredis_tls = {{ ca_file = {} }}\nkey_prefix = \"kvgate-tls\"\nfailure_policy = \"fail_closed\"\n",
        cluster.urls_toml(),
        toml_path(&files.ca)
    );
    let text = config(&unified_pool("u", &[worker(&engine, None)]), &limits);
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    let started = std::time::Instant::now();
    let outcomes = burst(&[&a, &b], 3 * RPM as usize).await;
    let ok = admitted(&outcomes);
    eprintln!(
        "TLS cluster: admitted {ok} of {} against {RPM} a minute",
        outcomes.len()
    );
    assert!(
        (RPM as usize..=RPM as usize + refilled(started)).contains(&ok),
        "admitted {ok} through the TLS cluster: {outcomes:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// Two replicas through TLS sentinels (`rediss://`) and a TLS primary (`primary_tls`).
#[tokio::test]
async fn limits_hold_through_tls_sentinels_and_a_tls_primary() {
    if !tls::available() {
        return;
    }
    let files = files("sentinel");
    let set = tokio::task::spawn_blocking({
        let files = files.clone();
        move || TlsSentinelSet::start(&files)
    })
    .await
    .expect("start the TLS sentinel set");
    let engine = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let limits = format!(
        "[limits]\nbackend = \"redis\"\nredis_tls = {{ ca_file = {} }}\nkey_prefix = \"kvgate-tls\"\nfailure_policy = \"fail_closed\"\n[limits.redis_sentinel]\nsentinels = {}\nprimary_name = \"{}\"\nprimary_tls = true\n",
        toml_path(&files.ca),
        set.sentinels_toml(),
        tls::PRIMARY_NAME
    );
    let text = config(&unified_pool("u", &[worker(&engine, None)]), &limits);
    let a = gateway(&text).await;
    let b = gateway(&text).await;
    let started = std::time::Instant::now();
    let outcomes = burst(&[&a, &b], 3 * RPM as usize).await;
    let ok = admitted(&outcomes);
    eprintln!(
        "TLS sentinels: admitted {ok} of {} against {RPM} a minute",
        outcomes.len()
    );
    assert!(
        (RPM as usize..=RPM as usize + refilled(started)).contains(&ok),
        "admitted {ok} through the TLS sentinels: {outcomes:?}"
    );
    let keys = set.data[0].cli(&["--scan"]);
    assert!(
        keys.iter().any(|k| k == "kvgate-tls:{metered}:req"),
        "the bucket lives on the TLS primary: {keys:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// What the bucket refilled (RPM a minute) since `started`, and one for the boundary: a
/// burst takes seconds on a loaded machine.
fn refilled(started: std::time::Instant) -> usize {
    (started.elapsed().as_secs_f64() * f64::from(RPM) / 60.0).ceil() as usize + 1
}
