//! `kvgate preflight` against the simulated engine: a healthy deployment passes, the
//! incident's fails naming the cause, in unified and prefill/decode modes; the quiet leak is
//! caught by the isolation probes, and the "v3 shape" (stale KV pages served with the exact
//! count, behind an overstated pool) by the cross-probe check; the budget, `--pool`,
//! `--json` and the exit codes of the real binary.

mod support;

use serde_json::Value;
use std::process::Command;

use kvgate::commands::preflight::{run, PreflightOptions, PreflightReport, Verdict};
use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 4096;
/// Tenant A's plant; tenant B's over-limit, short, limit − 1 and long prompts.
const ISOLATION_PROBES: usize = 5;
/// Four sizes (limit − 1, limit, limit + 1 and the model's window, 6 above the limit here)
/// on two routes, streamed and not.
const BOUNDARY_PROBES: usize = 4 * 4;

async fn unified(fault: SimFault, kv: usize) -> RunningSim {
    engine(SimRole::Unified, fault, kv, WINDOW as usize).await
}

/// A prefill (with `fault`) and a healthy decode engine of `kv` tokens, and their config.
async fn pd(fault: SimFault, kv: usize) -> (RunningSim, RunningSim, String) {
    let prefill = engine(SimRole::Prefill, fault, kv, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, kv, WINDOW as usize).await;
    let config = config_with_pools(
        WINDOW,
        &pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]),
    );
    (prefill, decode, config)
}

async fn preflight(config: &str) -> PreflightReport {
    run(&parse_config(config), &PreflightOptions::default())
        .await
        .expect("preflight runs")
}

fn failures(report: &PreflightReport) -> Vec<String> {
    report
        .targets
        .iter()
        .flat_map(|t| &t.probes)
        .filter(|p| p.verdict == Verdict::Fail)
        .map(|p| format!("{} {} {}: {}", p.kind, p.endpoint, p.name, p.detail))
        .collect()
}

fn probes_of<'a>(
    report: &'a PreflightReport,
    kind: &str,
) -> Vec<&'a kvgate::commands::preflight::ProbeResult> {
    report
        .targets
        .iter()
        .flat_map(|t| &t.probes)
        .filter(|p| p.kind == kind)
        .collect()
}

/// Every boundary size, on both routes, streaming and not.
fn assert_complete(report: &PreflightReport) {
    let boundary = probes_of(report, "boundary");
    for name in ["limit - 1", "limit", "limit + 1"] {
        for endpoint in ["/generate", "/v1/chat/completions"] {
            for stream in [false, true] {
                assert!(
                    boundary
                        .iter()
                        .any(|p| p.name == name && p.endpoint == endpoint && p.stream == stream),
                    "no {name} probe on {endpoint} (stream {stream})"
                );
            }
        }
    }
    assert_eq!(probes_of(report, "isolation").len(), ISOLATION_PROBES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_unified_deployment_passes_every_probe() {
    let sim = unified(SimFault::None, WINDOW as usize).await;
    let config = config_with_pools(WINDOW, &unified_pool("main", &[worker(&sim, None)]));
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Pass, "{report}");
    assert_eq!(report.exit_code(), 0);
    assert!(failures(&report).is_empty(), "{report}");
    assert_complete(&report);
    let target = &report.targets[0];
    // The probes sit at the engine's own limit: min(context − 1, KV − 1) − 5.
    assert_eq!(target.input_limit, Some(WINDOW - 6));
    let below = probes_of(&report, "boundary")
        .into_iter()
        .find(|p| p.name == "limit - 1" && p.endpoint == "/v1/chat/completions")
        .expect("chat at limit - 1");
    assert_eq!(below.prompt_tokens, WINDOW - 7);
    let evidence = below.evidence.as_ref().expect("answered");
    assert_eq!(
        evidence.prompt_tokens,
        Some(WINDOW - 7),
        "the chat prompt is counted exactly"
    );
    // Every probe went straight to the engine: discovery aside, it saw them all.
    assert_eq!(generations(&sim).len(), ISOLATION_PROBES + BOUNDARY_PROBES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incidents_unified_deployment_fails_naming_the_cause() {
    // The incident: a KV pool smaller than the model's window, and an engine that answers
    // an over-long prompt from a placeholder with a 200.
    let sim = unified(SimFault::Incident, 2048).await;
    let config = config_with_pools(WINDOW, &unified_pool("main", &[worker(&sim, None)]));
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Fail, "{report}");
    assert_eq!(report.exit_code(), 1);
    let target = &report.targets[0];
    assert!(
        target.capacity.iter().any(|f| f.verdict == Verdict::Warn
            && f.detail.contains("context window 4096 > KV pool 2048")
            && f.detail.contains("incident's mismatch")),
        "{report}"
    );
    let over: Vec<_> = probes_of(&report, "boundary")
        .into_iter()
        .filter(|p| p.name == "limit" || p.name == "limit + 1")
        .collect();
    assert!(!over.is_empty());
    for p in &over {
        assert_eq!(
            p.verdict,
            Verdict::Fail,
            "{} {}: {}",
            p.endpoint,
            p.name,
            p.detail
        );
        assert!(p.detail.contains("got a success"), "{}", p.detail);
        assert!(p.detail.contains("placeholder"), "{}", p.detail);
        let e = p.evidence.as_ref().expect("evidence");
        assert_eq!(e.status, 200);
        assert_eq!(
            e.prompt_tokens,
            Some(1),
            "the placeholder's count is the evidence"
        );
        assert!(!e.first_bytes.is_empty());
    }
    // Under the limit the faulty engine still serves correctly: the failures are precise.
    for p in probes_of(&report, "boundary")
        .into_iter()
        .filter(|p| p.name == "limit - 1")
    {
        assert_eq!(p.verdict, Verdict::Pass, "{}", p.detail);
    }
    let text = report.to_string();
    assert!(text.contains("FAIL"), "{text}");
    assert!(text.contains("first bytes:"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_prefill_decode_pair_passes_with_the_bootstrap_fields() {
    let (prefill, decode, config) = pd(SimFault::None, WINDOW as usize).await;
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Pass, "{report}");
    assert_complete(&report);
    assert_eq!(report.targets[0].mode, "disaggregated");
    // Both sides got every probe, with a room (the sim's prefill refuses one without).
    let p = generations(&prefill);
    assert_eq!(p.len(), ISOLATION_PROBES + BOUNDARY_PROBES);
    assert!(
        p.iter().all(|r| r.body["bootstrap_room"].is_u64()),
        "{:?}",
        p[0].body
    );
    assert_eq!(
        generations(&decode).len(),
        ISOLATION_PROBES + BOUNDARY_PROBES
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incidents_prefill_decode_pair_fails() {
    let (_prefill, _decode, config) = pd(SimFault::Incident, 2048).await;
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Fail, "{report}");
    let failed = failures(&report);
    // The pair's evidence shows both legs answered 200.
    let over = probes_of(&report, "boundary")
        .into_iter()
        .find(|p| p.name == "limit + 1")
        .expect("limit + 1 probe");
    assert_eq!(over.prefill_evidence.as_ref().map(|o| o.status), Some(200));
    assert_eq!(over.evidence.as_ref().map(|o| o.status), Some(200));
    assert!(
        failed.iter().any(|f| f.contains("boundary")
            && f.contains("got a success")
            && f.contains("placeholder")),
        "{failed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quiet_leak_is_caught_by_the_isolation_probes() {
    // Right counts, normal finishes, no marker: only tenant A's nonce in B's answer shows it.
    let sim = unified(SimFault::SilentLeak, WINDOW as usize).await;
    let config = config_with_pools(WINDOW, &unified_pool("main", &[worker(&sim, None)]));
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Fail, "{report}");
    let short = probes_of(&report, "isolation")
        .into_iter()
        .find(|p| p.name == "tenant B short prompt")
        .expect("B's short probe");
    assert_eq!(short.verdict, Verdict::Fail, "{}", short.detail);
    assert!(
        short.detail.contains("tenant A's nonce"),
        "{}",
        short.detail
    );
}

// === the v3 shape: stale KV pages served with the exact count ===

/// A prefill with `SimFault::StaleKv` and a pool of `kv` tokens that reports `reported`,
/// and a healthy decode of 8,192; both engines' context length is the model's window.
async fn stale_kv_pair(kv: usize, reported: usize) -> (RunningSim, RunningSim, String) {
    let prefill = engine_with(SimConfig {
        role: SimRole::Prefill,
        fault: SimFault::StaleKv,
        kv_tokens: kv,
        reported_kv_tokens: Some(reported),
        context_length: WINDOW as usize,
        model: "qwen3".into(),
        ..SimConfig::default()
    })
    .await;
    let decode = engine(SimRole::Decode, SimFault::None, 8192, WINDOW as usize).await;
    let config = config_with_pools(
        WINDOW,
        &pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]),
    );
    (prefill, decode, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_kv_pair_with_honest_capacity_fails() {
    // Its pool (2,048) is reported as it is, but it admits by its context length: prompts
    // at and over the limit are served instead of refused.
    let (_prefill, _decode, config) = stale_kv_pair(2048, 2048).await;
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Fail, "{report}");
    assert_eq!(report.exit_code(), 1);
    assert_eq!(report.targets[0].input_limit, Some(2042));
    let failed = failures(&report);
    assert!(
        failed
            .iter()
            .any(|f| f.starts_with("boundary") && f.contains("got a success")),
        "{failed:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_kv_pair_overstating_its_pool_fails_on_the_cross_probe_check() {
    // Real pool 2,048, reported 4,096: the limit comes from the window (4,096 − 6), so the
    // limit and over are refused by the engine's own context check and every answer below
    // it has the exact count, a normal finish and no marker. Prompts beyond the real pool
    // are answered from stale pages: only the nonces and the n-gram test can tell.
    let (prefill, _decode, config) = stale_kv_pair(2048, 4096).await;
    let report = preflight(&config).await;
    assert_eq!(report.result, Verdict::Fail, "{report}");
    assert_eq!(report.targets[0].input_limit, Some(WINDOW - 6));
    let all: Vec<_> = report.targets.iter().flat_map(|t| &t.probes).collect();
    assert_eq!(all.len(), ISOLATION_PROBES + BOUNDARY_PROBES, "{report}");
    assert_eq!(
        generations(&prefill).len(),
        all.len(),
        "every probe was sent"
    );
    // The checks on one answer alone pass it all: every failure is the new check's.
    let failed: Vec<_> = all.iter().filter(|p| p.verdict == Verdict::Fail).collect();
    assert!(!failed.is_empty());
    for p in &failed {
        assert!(
            p.detail.starts_with("answer of \""),
            "{} {}: {}",
            p.kind,
            p.name,
            p.detail
        );
        let e = p.evidence.as_ref().expect("answered");
        assert_eq!(e.status, 200);
        assert_eq!(e.prompt_tokens, Some(p.prompt_tokens), "the exact count");
        assert!(e.success_like && e.guard_trip.is_none());
    }
    for p in all
        .iter()
        .filter(|p| p.name == "limit" || p.name == "limit + 1")
    {
        assert_eq!(p.verdict, Verdict::Pass, "{}: {}", p.name, p.detail);
    }
    // The long prompt, beyond the real pool, got the short prompt's stale pages: the
    // finding names both probes and the nonce it found.
    let long = all
        .iter()
        .find(|p| p.name == "tenant B long prompt")
        .expect("B's long probe");
    assert_eq!(long.verdict, Verdict::Fail, "{report}");
    assert!(
        long.detail.starts_with(
            "answer of \"isolation /generate tenant B long prompt\" holds text of probe \"isolation /generate tenant B short prompt\" (nonce kvgate"
        ),
        "{}",
        long.detail
    );
}

// === the binary ===

/// A config file on disk (absolute tokenizer paths) for the real `kvgate preflight`.
fn config_file(dir: &std::path::Path, pools: &str) -> std::path::PathBuf {
    let tokenizers = repo().join("config/tokenizers");
    let text = config_with_pools(WINDOW, pools)
        .replace("\"tokenizers/", &format!("\"{}/", tokenizers.display()));
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

async fn kvgate(args: Vec<String>) -> (i32, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(&args)
            .output()
            .expect("run kvgate");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-preflight-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reports_json_and_exits_by_verdict() {
    let good = unified(SimFault::None, WINDOW as usize).await;
    let bad = unified(SimFault::Incident, 2048).await;
    let dir = temp_dir("binary");
    let pools = format!(
        "{}\n{}",
        unified_pool("good", &[worker(&good, None)]),
        unified_pool("bad", &[worker(&bad, None)])
    );
    let path = config_file(&dir, &pools);
    let config = path.display().to_string();
    let args = |extra: &[&str]| {
        let mut a = vec![
            "preflight".to_owned(),
            "--config".to_owned(),
            config.clone(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };

    // Only the healthy pool: exit 0, and the JSON says so per probe.
    let (code, out, err) = kvgate(args(&["--pool", "good", "--json"])).await;
    assert_eq!(code, 0, "{out}\n{err}");
    let json: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(json["result"], "PASS");
    assert_eq!(json["targets"].as_array().map(Vec::len), Some(1));
    assert_eq!(json["targets"][0]["pool"], "good");
    let probe = &json["targets"][0]["probes"][0];
    for key in [
        "kind",
        "name",
        "endpoint",
        "stream",
        "prompt_tokens",
        "verdict",
        "detail",
        "evidence",
    ] {
        assert!(probe.get(key).is_some(), "probe has no `{key}`: {probe}");
    }

    // Both pools: the faulty one fails the run, exit 1, in the human report too.
    let (code, out, err) = kvgate(args(&[])).await;
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("pool `bad`") && out.contains("FAIL"), "{out}");
    assert!(out.contains("evidence: status 200"), "{out}");

    // A budget too small for the probes: nothing failed, nothing proven — exit 2.
    let (code, out, err) = kvgate(args(&["--pool", "good", "--token-budget", "100"])).await;
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(out.contains("SKIPPED"), "{out}");

    // An unknown pool and an invalid config are refused with a clear message, exit 2.
    let (code, _, err) = kvgate(args(&["--pool", "nope"])).await;
    assert_eq!(code, 2);
    assert!(err.contains("--pool nope: no such pool"), "{err}");
    let broken = dir.join("broken.toml");
    std::fs::write(&broken, "[preflight]\ntoken_budget = 0\n").expect("write");
    let (code, _, err) = kvgate(vec![
        "preflight".into(),
        "--config".into(),
        broken.display().to_string(),
    ])
    .await;
    assert_eq!(code, 2);
    assert!(err.contains("invalid config"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A healthy llama.cpp-style engine (`-c 2048`) behind an `engine = "openai"` pool: its
/// boundaries are probed at its own capacity (a prompt of n_ctx tokens or more refused),
/// not at SGLang's `min(context − 1, kv − 1) − 5`; every probe passes, with UUID request ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_openai_style_engine_passes_at_its_true_capacity() {
    const N_CTX: u64 = 2048;
    let sim = engine_with(SimConfig {
        role: SimRole::Unified,
        fault: SimFault::LlamaCppLimits,
        kv_tokens: N_CTX as usize,
        context_length: N_CTX as usize,
        model: "qwen3".into(),
        server_info: false,
        ..SimConfig::default()
    })
    .await;
    let pool = unified_pool("llama", &[worker(&sim, Some(N_CTX))])
        .replace("engine = \"sglang\"", "engine = \"openai\"");
    let report = preflight(&config_with_pools(N_CTX, &pool)).await;
    assert_eq!(report.result, Verdict::Pass, "{report}");
    assert!(failures(&report).is_empty(), "{report}");
    assert_eq!(report.targets[0].input_limit, Some(N_CTX));
    let boundary = probes_of(&report, "boundary");
    let below = boundary
        .iter()
        .find(|p| p.name == "limit - 1" && !p.stream)
        .expect("chat at limit - 1");
    assert_eq!(below.prompt_tokens, N_CTX - 1, "{report}");
    assert_eq!(below.verdict, Verdict::Pass, "{report}");
    for r in sim.engine.received() {
        let Some(id) = r.headers.get("x-request-id") else {
            continue;
        };
        let id = id.to_str().unwrap_or_default();
        let groups: Vec<usize> = id.split('-').map(str::len).collect();
        assert_eq!(groups, [8, 4, 4, 4, 12], "a UUID-shaped request id: {id}");
        assert!(
            id.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()),
            "{id}"
        );
    }
}
