//! The admin status page (`GET /status`) in a real headless browser: after successful,
//! refused and guard-tripped requests and two reloads (one refused, one ok), the page a
//! browser renders shows what the gateway holds — each worker's capacity, health and load
//! as `GET /pools` reports them, the enforced prompt limit per pool, the counts of admits,
//! refusals by code and trips by reason, each pool's gateway queue, and the last reload. A
//! screenshot is kept as `target/test-artifacts/status.png`.

mod support;
mod support_browser;

use http::{Method, StatusCode};
use regex::Regex;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Instant, UNIX_EPOCH};

use kvgate::stack::admission::PoolBudget;
use kvgate_sim::{SimFault, SimRole};
use support::*;
use support_browser::Browser;

/// A window larger than the engines' KV pools: the incident's configuration, which the
/// page flags; the pool's limit is what admission enforces.
const WINDOW: u64 = 8192;
const KV: usize = 4096;
const TOKEN_ENV: &str = "KVGATE_STATUS_PAGE_TEST_TOKEN";
const TOKEN: &str = "status-page-test-token";
/// A label from the config with markup in it: the page must show it as text.
const CANARY_VERSION: &str = "0.6 <b>rc</b>";

fn chat(text: &str) -> Value {
    json!({"model": "qwen3", "max_tokens": 4, "messages": [{"role": "user", "content": text}]})
}

/// The config file's text: `stable` (a healthy engine) and `canary` (an engine that
/// misreports `prompt_tokens`, weight 0, reachable with `x-kvgate-pool`).
fn config_text(stable: &str, canary: &str) -> String {
    let mut pools = unified_pool("stable", &[stable.to_owned()]);
    pools.push_str("version = \"0.5.22\"\n");
    pools.push_str(&unified_pool("canary", &[canary.to_owned()]));
    pools.push_str(&format!("weight = 0\nversion = \"{CANARY_VERSION}\"\n"));
    pools.push_str("\n[[rollouts]]\nmodel = \"qwen3\"\nstable = \"stable\"\ncanary = \"canary\"\nmin_requests = 1000\n");
    config_with_pools(WINDOW, &pools)
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
        )
        .replace(
            &format!("api_key_sha256 = [\"{KEY_SHA256}\"]\n"),
            &format!("api_key_sha256 = [\"{KEY_SHA256}\"]\nchoose_pool = true\n"),
        )
        // Tokenizer paths are relative to the config file, which lives in a temp dir.
        .replace(
            "tokenizers/",
            &format!("{}/config/tokenizers/", repo().display()),
        )
}

/// The `<tr>` whose attribute `attr` is `value`.
fn row<'a>(dom: &'a str, attr: &str, value: &str) -> &'a str {
    let open = format!("<tr {attr}=\"{value}\"");
    let start = dom
        .find(&open)
        .unwrap_or_else(|| panic!("no row {open} in the page:\n{dom}"));
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    &dom[start..end]
}

/// The text of the element with `data-field="name"` in `html`.
fn field(html: &str, name: &str) -> String {
    let re = Regex::new(&format!(r#"data-field="{name}"[^>]*>([^<]*)<"#)).expect("regex");
    re.captures(html)
        .unwrap_or_else(|| panic!("no field {name} in {html}"))[1]
        .trim()
        .to_owned()
}

/// An attribute's value on the element with `id`.
fn attr_of(dom: &str, id: &str, attr: &str) -> String {
    let re = Regex::new(&format!(r#"<[^>]* id="{id}"[^>]*>"#)).expect("regex");
    let tag = re
        .find(dom)
        .unwrap_or_else(|| panic!("no element #{id} in the page"))
        .as_str();
    let re = Regex::new(&format!(r#"{attr}="([^"]*)""#)).expect("regex");
    re.captures(tag)
        .unwrap_or_else(|| panic!("#{id} has no {attr}: {tag}"))[1]
        .to_owned()
}

fn count_of(dom: &str, id: &str) -> u64 {
    attr_of(dom, id, "data-count").parse().expect("a count")
}

/// The count in the breakdown row of `kind` / `key` (0 when the page lists no such row).
fn breakdown(dom: &str, kind: &str, key: &str) -> u64 {
    let open = format!("<tr data-kind=\"{kind}\" data-key=\"{key}\"");
    if !dom.contains(&open) {
        return 0;
    }
    field(
        row(dom, "data-kind", &format!("{kind}\" data-key=\"{key}")),
        "count",
    )
    .parse()
    .expect("a count")
}

fn artifact() -> PathBuf {
    // CARGO_TARGET_TMPDIR is <target>/tmp: the artifact goes beside it.
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .map_or_else(|| repo().join("target"), PathBuf::from)
        .join("test-artifacts/status.png")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_gateways_state_in_a_real_browser() {
    let browser = Browser::find();
    std::env::set_var(TOKEN_ENV, TOKEN);
    let healthy = engine(SimRole::Unified, SimFault::None, KV, WINDOW as usize).await;
    let faulty = engine(
        SimRole::Unified,
        SimFault::WrongPromptTokens,
        KV,
        WINDOW as usize,
    )
    .await;
    let dir = std::env::temp_dir().join(format!("kvgate-status-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("kvgate.toml");
    let text = config_text(&worker(&healthy, None), &worker(&faulty, None));
    std::fs::write(&path, &text).expect("write the config");
    let config = kvgate::config::Config::load(&path).expect("the config loads");
    let gw = kvgate::runtime::Gateway::new(config)
        .expect("gateway builds")
        .start(bind().await, bind().await)
        .await
        .expect("gateway starts");
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());

    // Three admitted, three refused: over-long, bad key, and a guard trip on the canary.
    let (mut prompt, mut completion) = (0, 0);
    for i in 0..3 {
        let reply = post(&url, Some(KEY), &chat(&format!("hello number {i}"))).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let usage = &reply.json()["usage"];
        prompt += usage["prompt_tokens"].as_u64().expect("prompt_tokens");
        completion += usage["completion_tokens"]
            .as_u64()
            .expect("completion_tokens");
    }
    let reply = post(&url, Some(KEY), &chat(&"hello ".repeat(6000))).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    assert_eq!(error_code(&reply), "context_length_exceeded");
    let reply = post(&url, Some("not-a-key"), &chat("hello")).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(error_code(&reply), "invalid_api_key");
    let reply = post_with(
        &url,
        Some(KEY),
        &[("x-kvgate-pool", "canary")],
        &chat("hello canary"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{}", reply.text());
    assert_eq!(error_code(&reply), "upstream_integrity_error");

    // A refused reload shows its error; then a good one replaces it.
    std::fs::write(&path, "this is = = not toml").expect("break the config");
    let reply = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.text());
    let page = admin(&gw, Method::GET, "/status", None).await;
    assert_eq!(
        page.status,
        StatusCode::OK,
        "no token needed: {}",
        page.text()
    );
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    let html = page.text();
    assert!(
        html.contains("id=\"reload-state\" data-state=\"error\""),
        "{html}"
    );
    assert!(html.contains("id=\"reload-error\""), "{html}");
    // Self-contained: nothing is loaded from anywhere.
    for external in ["<script", "<link", "src=", "href=", "url("] {
        assert!(!html.contains(external), "the page loads {external}");
    }
    std::fs::write(&path, &text).expect("restore the config");
    let reply = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let reloaded = gw.reloader().last().expect("a reload is on record");
    assert_eq!(reloaded.result, Ok(()));

    // What the browser renders.
    let status_url = format!("http://{}/status", gw.admin_addr());
    let started = Instant::now();
    let dom = tokio::task::spawn_blocking({
        let (browser, status_url) = (browser.clone(), status_url.clone());
        move || browser.dump_dom(&status_url)
    })
    .await
    .expect("the browser ran");
    eprintln!("chromium --dump-dom took {:?}", started.elapsed());
    assert!(dom.contains("<title>kvgate status</title>"), "{dom}");

    // Workers: capacity, health and load as GET /pools has them.
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let workers: Vec<&Value> = pools["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["workers"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(workers.len(), 2, "{pools}");
    for w in workers {
        let addr = w["worker"].as_str().expect("worker address");
        let tr = row(&dom, "data-worker", addr);
        assert_eq!(field(tr, "kv_tokens"), w["kv_tokens"].to_string(), "{addr}");
        assert_eq!(
            field(tr, "kv_tokens"),
            KV.to_string(),
            "discovered capacity"
        );
        let state = w["health"]["state"].as_str().expect("health state");
        assert!(
            tr.contains(&format!("data-field=\"health\" data-state=\"{state}\"")),
            "{addr} health {state}: {tr}"
        );
        assert_eq!(field(tr, "outstanding"), w["outstanding"].to_string());
    }

    // Pools: weights, the rollout roles, and config text shown as text, never as markup.
    let stable = row(&dom, "data-pool", "stable");
    assert_eq!(field(stable, "weight"), "100");
    assert!(stable.contains(">stable</span>"), "{stable}");
    let canary = row(&dom, "data-pool", "canary");
    assert_eq!(field(canary, "weight"), "0");
    assert!(canary.contains(">canary</span>"), "{canary}");
    assert_eq!(field(canary, "version"), "0.6 &lt;b&gt;rc&lt;/b&gt;");
    assert!(!dom.contains("<b>rc</b>"), "config text became markup");

    // Gateway queues: each pool's queue as GET /pools has it (empty, the default bound).
    for p in pools["pools"].as_array().into_iter().flatten() {
        let name = p["pool"].as_str().expect("pool name");
        let q = &p["queue"];
        let tr = row(&dom, "data-queue", name);
        assert_eq!(field(tr, "queue_length"), q["length"].to_string(), "{name}");
        assert_eq!(field(tr, "queue_length"), "0", "{name}");
        assert_eq!(
            field(tr, "max_queued"),
            q["max_queued"].to_string(),
            "{name}"
        );
        assert_eq!(field(tr, "max_queued"), "256", "{name}: the default bound");
        for class in ["critical", "standard", "sheddable"] {
            assert_eq!(
                field(tr, class),
                q["by_class"][class].to_string(),
                "{name} {class}"
            );
        }
        assert_eq!(field(tr, "oldest_wait"), "0.0 s", "{name}");
        assert_eq!(field(tr, "drain"), "0.00/s", "{name}");
        assert_eq!(
            field(tr, "retry_after"),
            format!("{} s", q["retry_after_seconds"]),
            "{name}"
        );
    }

    // Models: the limit admission enforces, and the window-larger-than-KV flag.
    let router = gw.fleet();
    let pool = router.pool("stable").expect("pool stable");
    let limit = PoolBudget::of(pool, WINDOW)
        .max_prompt_tokens()
        .expect("a limit");
    let model_row = row(&dom, "data-model", "qwen3\" data-pool=\"stable");
    assert_eq!(field(model_row, "limit"), limit.to_string());
    assert_eq!(field(model_row, "context_window"), WINDOW.to_string());
    assert!(model_row.contains("window &gt; KV pool"), "{model_row}");

    // Recent activity: every outcome counted once, by code and reason.
    assert_eq!(count_of(&dom, "admits-total"), 3);
    assert_eq!(count_of(&dom, "admits-minute"), 3);
    assert_eq!(count_of(&dom, "refusals-total"), 3);
    assert_eq!(breakdown(&dom, "refusal", "context_length_exceeded"), 1);
    assert_eq!(breakdown(&dom, "refusal", "invalid_api_key"), 1);
    assert_eq!(breakdown(&dom, "refusal", "upstream_integrity_error"), 1);
    assert_eq!(count_of(&dom, "trips-total"), 1);
    assert_eq!(breakdown(&dom, "guard_trip", "prompt_tokens_mismatch"), 1);
    assert_eq!(count_of(&dom, "leaks-total"), 0);
    assert!(dom.contains("<svg class=\"chart"), "charts are drawn");
    // The caption names the charts' window, not the time since the start (issue 40).
    assert_eq!(attr_of(&dom, "activity-window", "data-seconds"), "600");
    let caption = Regex::new(r#"id="activity-window"[^>]*>([^<]*)<"#)
        .expect("regex")
        .captures(&dom)
        .map(|c| c[1].to_owned())
        .unwrap_or_default();
    assert!(caption.contains("over the last 10 min"), "{caption}");

    // Tenants, last hour: the bad key is nobody's; the other five are t1's (two errors), with
    // the tokens the engine reported for its three answers.
    let tenant = row(&dom, "data-tenant", "t1");
    assert_eq!(field(tenant, "requests"), "5", "{tenant}");
    assert_eq!(field(tenant, "errors"), "2", "{tenant}");
    assert_eq!(field(tenant, "prompt"), prompt.to_string(), "{tenant}");
    assert_eq!(
        field(tenant, "completion"),
        completion.to_string(),
        "{tenant}"
    );
    assert_eq!(attr_of(&dom, "tenants-window", "data-minutes"), "60");

    // The last reload: ok, at the time the gateway recorded.
    assert_eq!(attr_of(&dom, "reload-state", "data-state"), "ok");
    let at = reloaded
        .at
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    assert_eq!(attr_of(&dom, "reload-at", "data-unix"), at.to_string());
    assert!(
        !dom.contains("id=\"reload-error\""),
        "the old error is gone"
    );

    let png = artifact();
    let started = Instant::now();
    tokio::task::spawn_blocking({
        let png = png.clone();
        move || browser.screenshot(&status_url, &png, 1280, 1600)
    })
    .await
    .expect("the browser ran");
    eprintln!("screenshot {} took {:?}", png.display(), started.elapsed());
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
