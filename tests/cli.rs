//! The command line: `check` (I4 loud mismatch), `hash-key`, and the demo deployment.

mod support;

use serde_json::json;
use std::process::Command;
use support::*;

fn kvgate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run kvgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_flags_the_incident_configuration_and_strict_fails_it() {
    let (code, out, _) = kvgate(&["check", "--config", "config/incident.toml"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("context window 1048576"), "{out}");
    assert!(
        out.contains("smallest prefill input limit: 681274"),
        "{out}"
    );
    assert!(
        out.contains("enforced prompt limit:        681273"),
        "{out}"
    );
    assert!(out.contains("WARNING") && out.contains("incident"), "{out}");

    let (code, _, err) = kvgate(&["check", "--strict", "--config", "config/incident.toml"]);
    assert_eq!(code, 3, "{err}");
}

#[test]
fn check_accepts_the_shipped_configs_and_rejects_an_invalid_one_naming_the_key() {
    for file in ["config/example.toml", "config/demo.toml"] {
        let (code, out, err) = kvgate(&["check", "--config", file]);
        assert_eq!(code, 0, "{file}: {out}{err}");
        assert!(out.contains("is valid"));
    }
    let (code, _, err) = kvgate(&[
        "check",
        "--config",
        "config/fixtures/invalid/unknown-top-key.toml",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("colour"), "{err}");
}

#[test]
fn hash_key_prints_the_sha256_the_config_expects() {
    let (code, out, _) = kvgate(&["hash-key", KEY]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), KEY_SHA256);
}

#[test]
fn every_subcommand_has_help() {
    for sub in ["serve", "check", "sim-engine", "demo", "hash-key"] {
        let (code, out, _) = kvgate(&[sub, "--help"]);
        assert_eq!(code, 0, "{sub}");
        assert!(out.contains("Usage"), "{sub}: {out}");
    }
}

#[tokio::test]
async fn demo_serves_both_pools_on_loopback() {
    let args = kvgate::demo::DemoArgs {
        config: repo().join("config/demo.toml"),
        fault: kvgate::sim::SimFault::None,
        token_latency_ms: 0,
        ephemeral: true,
    };
    let demo = kvgate::demo::start(&args).await.expect("demo starts");
    assert_eq!(demo.engines.len(), 3);
    let banner = kvgate::demo::banner(&demo);
    assert!(banner.contains(kvgate::demo::DEMO_API_KEY));
    let base = format!("http://{}", demo.gateway.data_addr());
    let mut pools = std::collections::HashSet::new();
    for stream in [false, true] {
        for _ in 0..2 {
            let body = json!({"model": "qwen3", "stream": stream, "max_tokens": 4,
                              "messages": [{"role": "user", "content": "Hello from the demo"}]});
            let reply = post(&format!("{base}/v1/chat/completions"), Some(KEY), &body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            pools.insert(reply.headers["x-kvgate-pool"].to_str().unwrap().to_owned());
        }
    }
    assert_eq!(
        pools.len(),
        2,
        "both the PD and the unified pool served: {pools:?}"
    );
    let ready = get(&format!("http://{}/ready", demo.gateway.admin_addr()), None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    demo.shutdown().await;
}
