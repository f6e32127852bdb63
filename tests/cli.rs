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
fn check_reads_the_redis_tls_files_as_a_start_would() {
    // The shipped fixture's CA is a usable certificate.
    let (code, out, err) = kvgate(&["check", "--config", "config/fixtures/valid/redis-tls.toml"]);
    assert_eq!(code, 0, "{out}{err}");
    // The same config with a CA file that exists but holds no certificate: the load's
    // checks pass (the file is there), a start would fail, so check fails too.
    let dir = std::env::temp_dir().join(format!("kvgate-check-redis-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("not-a-ca.pem"), "not a certificate\n").unwrap();
    let fixtures = repo().join("config/fixtures");
    let text = std::fs::read_to_string(fixtures.join("valid/redis-tls.toml"))
        .unwrap()
        .replace(
            "../../tokenizers/",
            &format!("{}/", repo().join("config/tokenizers").display()),
        )
        .replace("../redis-ca.pem", "not-a-ca.pem");
    let config = dir.join("kvgate.toml");
    std::fs::write(&config, text).unwrap();
    let (code, _, err) = kvgate(&["check", "--config", config.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("limits.redis_tls"), "{err}");
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

/// The demo as `kvgate demo --ephemeral` starts it.
fn demo_args() -> kvgate::commands::demo::DemoArgs {
    kvgate::commands::demo::DemoArgs {
        config: Some(repo().join("config/demo.toml")),
        fault: kvgate_sim::SimFault::None,
        canary: false,
        canary_fault: None,
        token_latency_ms: 0,
        ephemeral: true,
    }
}

#[tokio::test]
async fn demo_serves_both_pools_on_loopback() {
    let demo = kvgate::commands::demo::start(&demo_args())
        .await
        .expect("demo starts");
    // pd (prefill, decode), unified, and the vision model's pool.
    assert_eq!(demo.engines.len(), 4);
    let banner = kvgate::commands::demo::banner(&demo);
    assert!(banner.contains(kvgate::commands::demo::DEMO_API_KEY));
    let base = format!("http://{}", demo.gateway.data_addr());
    let url = format!("{base}/v1/chat/completions");
    let mut pools = std::collections::HashSet::new();
    for stream in [false, true] {
        for _ in 0..2 {
            let body = json!({"model": "qwen3", "stream": stream, "max_tokens": 4,
                              "messages": [{"role": "user", "content": "Hello from the demo"}]});
            let reply = post(&url, Some(KEY), &body).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            pools.insert(reply.headers["x-kvgate-pool"].to_str().unwrap().to_owned());
        }
    }
    assert_eq!(pools.len(), 1, "one tenant sticks to one pool: {pools:?}");
    // The demo tenant may choose a pool: both the PD and the unified pool serve.
    for pool in ["pd", "unified"] {
        let body = json!({"model": "qwen3", "max_tokens": 4,
                          "messages": [{"role": "user", "content": "Hello from the demo"}]});
        let reply = post_with(&url, Some(KEY), &[("x-kvgate-pool", pool)], &body).await;
        assert_eq!(reply.status, 200, "{pool}: {}", reply.text());
        assert_eq!(reply.headers["x-kvgate-pool"], pool);
    }
    let ready = get(&format!("http://{}/ready", demo.gateway.admin_addr()), None).await;
    assert_eq!(ready.status, 200, "{}", ready.text());
    demo.shutdown().await;
}

/// The official OpenAI SDK against `kvgate demo`: models.retrieve, content parts,
/// enable_thinking and the tool loop plain and streamed (`tests/sdk/openai_client.py`, the
/// script the demo's banner prints).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_and_anthropic_sdks_work_against_the_demo() {
    let Some(python) = sdk_python() else {
        return;
    };
    let demo = kvgate::commands::demo::start(&demo_args())
        .await
        .expect("demo starts");
    let banner = kvgate::commands::demo::banner(&demo);
    assert!(banner.contains("tests/sdk/openai_client.py") && banner.contains("tool_choice"));
    assert!(banner.contains("anthropic.Anthropic(") && banner.contains("count_tokens"));
    assert!(banner.contains("--image-model qwen2.5-vl") && banner.contains("image_url"));
    let base = format!("http://{}/v1", demo.gateway.data_addr());
    run_openai_sdk(
        python,
        base,
        &["--embeddings", "--responses", "--image-model", "qwen2.5-vl"],
        String::new,
    )
    .await;
    // The Anthropic SDK: messages plain, streamed and the tool loop, count_tokens.
    if let Some(python) = anthropic_python() {
        let root = format!("http://{}", demo.gateway.data_addr());
        let cases = run_anthropic_sdk(python, root, "qwen3").await;
        assert_eq!(cases["messages.count_tokens"]["ok"], true, "{cases:?}");
    }
    demo.shutdown().await;
}

/// `kvgate serve` as a real process: SIGHUP reloads tenants (a revoked key stops working
/// without a restart) and SIGTERM drains and exits 0.
#[cfg(unix)]
#[test]
fn serve_reloads_keys_on_sighup_and_exits_cleanly_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("kvgate-sighup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("kvgate.toml");
    let write = |keys: &[&str]| {
        let hashes: Vec<String> = keys
            .iter()
            .map(|k| format!("\"{}\"", kvgate::stack::auth::hash_key(k)))
            .collect();
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndrain_timeout = \"2s\"\n[audit]\nsink = \"none\"\n[[models]]\nname = \"qwen3\"\ntokenizer = \"{root}/config/tokenizers/qwen3/tokenizer.json\"\ncontext_window = 4096\n[[pools]]\nname = \"u\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{{ url = \"http://127.0.0.1:9\", kv_tokens = 4096 }}]\n[[tenants]]\nname = \"t\"\napi_key_sha256 = [{}]\n",
            hashes.join(", "),
            root = repo().display()
        );
        std::fs::write(&config, text).unwrap();
    };
    write(&["sk-one", "sk-two"]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvgate"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn kvgate serve");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("kvgate exited before listening")
            .unwrap();
        if let Some(rest) = line.split("data_addr=").nth(1) {
            break rest
                .split_whitespace()
                .next()
                .unwrap()
                .trim_matches('"')
                .to_owned();
        }
    };
    // Drain the rest of stderr so the child never blocks on a full pipe.
    let reader =
        std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    let status_of = |key: &str| -> u16 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            get(&format!("http://{addr}/v1/models"), Some(key))
                .await
                .status
                .as_u16()
        })
    };
    assert_eq!(status_of("sk-one"), 200);
    write(&["sk-two"]);
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while status_of("sk-one") != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "SIGHUP did not revoke the key"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(status_of("sk-two"), 200);
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    let log = reader.join().unwrap();
    assert!(log.contains("config reloaded"), "{log}");
    assert!(
        !log.contains("sk-one") && !log.contains("sk-two"),
        "keys never reach the log"
    );
    let _ = std::fs::remove_dir_all(dir);
}
