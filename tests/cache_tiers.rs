//! Cache tiers below the GPU prefix cache (issue 40): a salted pool in front of an engine
//! whose lower cache level ignores the salt serves nothing and says why (`GET /pools`, the
//! 503, `kvgate check --discover`), unless it opts out; preflight fails such an engine —
//! by its reported cached tokens, and by time to first token where it restores silently —
//! and passes a healthy one; and preflight against engines it cannot reach says so once per
//! worker instead of failing every probe.

mod support;

use http::{Method, StatusCode};
use serde_json::json;
use std::process::Command;
use std::time::Duration;

use kvgate::commands::preflight::{run, PreflightOptions, PreflightReport, Verdict};
use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 4096;
const TOKEN_ENV: &str = "KVGATE_CACHE_TIERS_TEST_TOKEN";
const TOKEN: &str = "cache-tiers-test-token";
const KEY_2: &str = "cache-tiers-second-key";

/// A unified engine with `fault`, paced so a prefill takes time (50 µs a prompt token:
/// about 100 ms for the 2,048-token probes, nothing for a cached one).
async fn sim(fault: SimFault) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        fault,
        kv_tokens: 16_384,
        context_length: WINDOW as usize,
        model: "qwen3".into(),
        prefill_token_latency: Duration::from_micros(50),
        ..SimConfig::default()
    })
    .await
}

/// The standard config with a second tenant (so the pool keeps tenants apart) and an admin
/// token; `extra` goes into the pool's table.
fn two_tenants(engine: &RunningSim, extra: &str) -> String {
    std::env::set_var(TOKEN_ENV, TOKEN);
    let pool = format!("{}{extra}\n", unified_pool("main", &[worker(engine, None)]));
    format!(
        "{}\n{}",
        config_with_pools(WINDOW, &pool).replacen(
            "[server]\n",
            &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
            1
        ),
        tenant_table("t2", KEY_2)
    )
}

fn chat() -> serde_json::Value {
    json!({"model": "qwen3", "max_tokens": 4,
           "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_salted_pool_on_a_shared_lower_tier_serves_nothing_and_says_why() {
    let engine = sim(SimFault::SharedLowerTier).await;
    let gw = gateway(&two_tenants(&engine, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat()).await;
    // The client learns no more than for any pool out of workers; the admin port says why.
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(error_code(&reply), "no_eligible_worker");
    assert!(engine
        .engine
        .received()
        .iter()
        .all(|r| r.path != "/v1/chat/completions"));

    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let w = &pools["pools"][0]["workers"][0];
    assert_eq!(w["eligible"], false, "{w}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("hicache_storage_backend = \"file\"")
            && reason.contains("allow_shared_cache_tiers"),
        "{reason}"
    );
    assert_eq!(w["cache_tiers"]["tiers"][1]["tier"], "storage", "{w}");
    assert_eq!(w["cache_tiers"]["tiers"][1]["salted"], false, "{w}");
    assert_eq!(w["cache_tiers"]["tiers"][1]["source"], "reported", "{w}");
    let page = admin(&gw, Method::GET, "/status", Some(TOKEN)).await.text();
    assert!(
        page.contains("shared cache tier"),
        "the status page names it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_opt_out_serves_and_a_healthy_engine_or_one_tenant_needs_none() {
    let engine = sim(SimFault::SharedLowerTier).await;
    let gw = gateway(&two_tenants(&engine, "allow_shared_cache_tiers = true")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    assert_eq!(post(&url, Some(KEY), &chat()).await.status, StatusCode::OK);

    let healthy = sim(SimFault::None).await;
    let gw = gateway(&two_tenants(&healthy, "")).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    assert_eq!(
        post(&url, Some(KEY_2), &chat()).await.status,
        StatusCode::OK
    );

    // One tenant only: nobody to keep apart.
    let gw = gateway(&config_with_pools(
        WINDOW,
        &unified_pool("main", &[worker(&engine, None)]),
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    assert_eq!(post(&url, Some(KEY), &chat()).await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_speaks_for_an_engine_that_reports_nothing() {
    // The silent variant reports no tiers (like vLLM, or llama.cpp): the pool's word counts.
    let engine = sim(SimFault::SharedLowerTierSilent).await;
    let gw = gateway(&two_tenants(
        &engine,
        "cache_tiers = [{ tier = \"lmcache\" }]",
    ))
    .await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat()).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let reason = pools["pools"][0]["workers"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("`lmcache` (configured"), "{reason}");
}

// === preflight ===

async fn preflight(config: &str) -> PreflightReport {
    run(&parse_config(config), &PreflightOptions::default())
        .await
        .expect("preflight runs")
}

fn shared_cache(report: &PreflightReport) -> &kvgate::commands::preflight::ProbeResult {
    report
        .targets
        .iter()
        .flat_map(|t| &t.probes)
        .find(|p| p.kind == "shared-cache")
        .unwrap_or_else(|| panic!("no shared-cache check:\n{report}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_fails_a_shared_lower_tier_and_passes_a_healthy_engine() {
    let healthy = sim(SimFault::None).await;
    let report = preflight(&two_tenants(&healthy, "")).await;
    let check = shared_cache(&report);
    assert_eq!(check.verdict, Verdict::Pass, "{report}");
    assert!(
        check.detail.contains("by cached_tokens and by timing"),
        "{}",
        check.detail
    );
    assert_eq!(report.result, Verdict::Pass, "{report}");

    let faulty = sim(SimFault::SharedLowerTier).await;
    let report = preflight(&two_tenants(&faulty, "allow_shared_cache_tiers = true")).await;
    let check = shared_cache(&report);
    assert_eq!(check.verdict, Verdict::Fail, "{report}");
    assert!(
        check.detail.starts_with("round 1: tenant B"),
        "{}",
        check.detail
    );
    assert!(check.detail.contains("cached_tokens"), "{}", check.detail);
    assert_eq!(report.exit_code(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_times_a_silent_restore() {
    // No cached tokens reported, nothing in /get_server_info: only the timing shows it.
    let faulty = sim(SimFault::SharedLowerTierSilent).await;
    let report = preflight(&two_tenants(&faulty, "")).await;
    let check = shared_cache(&report);
    assert_eq!(check.verdict, Verdict::Fail, "{report}");
    assert!(
        check
            .detail
            .contains("time to first token shows a cache hit"),
        "{}",
        check.detail
    );
    assert!(
        check.detail.contains("reports no cached tokens"),
        "{}",
        check.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_reports_unreachable_workers_once_and_sends_nothing() {
    // Two ports nothing listens on (tcpmux and discard: no service runs there).
    let (a, b) = ("127.0.0.1:1", "127.0.0.1:9");
    let pool = unified_pool(
        "gone",
        &[
            format!("{{ url = \"http://{a}\", kv_tokens = 4096 }}"),
            format!("{{ url = \"http://{b}\", kv_tokens = 4096 }}"),
        ],
    );
    let report = preflight(&config_with_pools(WINDOW, &pool)).await;
    assert_eq!(report.tokens_sent, 0, "{report}");
    assert_eq!(report.exit_code(), 1);
    let text = report.to_string();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("FAIL")).collect();
    assert_eq!(
        lines.len(),
        3,
        "one line per worker, and the summary:\n{text}"
    );
    assert!(lines[0].contains("unreachable, not probed") && lines[0].contains(a));
    assert!(lines[1].contains("unreachable, not probed") && lines[1].contains(b));
    assert!(text.contains("2 unreachable; 0 of"), "{text}");
}

// === kvgate check --discover ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_discover_names_the_worker_and_strict_fails() {
    let engine = sim(SimFault::SharedLowerTier).await;
    let dir = std::env::temp_dir().join(format!("kvgate-cache-tiers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tokenizers = repo().join("config/tokenizers");
    let text =
        two_tenants(&engine, "").replace("\"tokenizers/", &format!("\"{}/", tokenizers.display()));
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, text).expect("write config");
    let run = |strict: bool| {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut args = vec![
                "check",
                "--config",
                path.to_str().unwrap_or(""),
                "--discover",
            ];
            if strict {
                args.push("--strict");
            }
            let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
                .args(&args)
                .output()
                .expect("run kvgate");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
    };
    let (code, out) = run(false).await.expect("join");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("cache tiers host (salted, reported), storage (NOT salted, reported)"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "WARNING: pool `main`: unified {}",
            engine.http_addr
        )) && out.contains("shared cache tier `storage`"),
        "{out}"
    );
    let (code, out) = run(true).await.expect("join");
    assert_eq!(code, 3, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
