//! Tenants end to end: keys (config hashes, env var, file), reload without a restart,
//! allowed models, caps on prompt and new tokens, pool pinning and dedicated pools.

mod support;

use serde_json::json;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

fn config(pools: &str, tenants: &str) -> String {
    format!(
        r#"
[server]
admin_token_env = "KVGATE_TEST_ADMIN_TOKEN"
[audit]
sink = "none"
[upstream]
discovery_interval = "1h"
{}{}{pools}
{tenants}
"#,
        model_table("qwen3", WINDOW),
        model_table("qwen3-large", WINDOW)
    )
}

fn pool(name: &str, model: &str, url: std::net::SocketAddr, extra: &str) -> String {
    format!("[[pools]]\nname = \"{name}\"\nmodel = \"{model}\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{{ url = \"http://{url}\", kv_tokens = 40960 }}]\n{extra}\n")
}

fn hash(key: &str) -> String {
    kvgate::stack::auth::hash_key(key)
}

fn gen(model: &str) -> serde_json::Value {
    json!({"model": model, "text": "hello tenant", "sampling_params": {"max_new_tokens": 2}})
}

#[tokio::test]
async fn models_caps_pinning_and_dedicated_pools_apply_per_tenant() {
    let a = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let b = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let large = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = [
        pool("a", "qwen3", a.http_addr, ""),
        pool("b", "qwen3", b.http_addr, ""),
        pool(
            "large",
            "qwen3-large",
            large.http_addr,
            "tenants = [\"big\"]",
        ),
    ]
    .concat();
    let tenants = format!(
        r#"
[[tenants]]
name = "small"
api_key_sha256 = ["{}"]
models = ["qwen3"]
pools = ["b"]
max_prompt_tokens = 50
max_new_tokens = 8

[[tenants]]
name = "big"
api_key_sha256 = ["{}"]

[[tenants]]
name = "other"
api_key_sha256 = ["{}"]
"#,
        hash("sk-small"),
        hash("sk-big"),
        hash("sk-other")
    );
    let gw = gateway(&config(&pools, &tenants)).await;
    let url = format!("http://{}/generate", gw.data_addr());

    // Allowed models: 403 model_not_allowed.
    let r = post(&url, Some("sk-small"), &gen("qwen3-large")).await;
    assert_eq!(
        (r.status.as_u16(), error_code(&r).as_str()),
        (403, "model_not_allowed"),
        "{}",
        r.text()
    );
    // A dedicated pool serves only its tenants: "other" may name the model, but no pool serves it.
    let r = post(&url, Some("sk-other"), &gen("qwen3-large")).await;
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(
        post(&url, Some("sk-big"), &gen("qwen3-large")).await.status,
        200
    );

    // Pinning: every request of "small" lands on pool b.
    for _ in 0..4 {
        let r = post(&url, Some("sk-small"), &gen("qwen3")).await;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.headers["x-kvgate-pool"], "b");
    }
    assert_eq!(generations(&a).len(), 0);

    // Prompt cap: 400 context_length_exceeded naming the tenant's cap.
    let long = json!({"model": "qwen3", "input_ids": vec![1u32; 51], "sampling_params": {"max_new_tokens": 2}});
    let r = post(&url, Some("sk-small"), &long).await;
    assert_eq!(
        (r.status.as_u16(), error_code(&r).as_str()),
        (400, "context_length_exceeded")
    );
    assert!(r.text().contains("tenant `small`"), "{}", r.text());
    // "big" has no cap.
    assert_eq!(post(&url, Some("sk-big"), &long).await.status, 200);

    // New-token cap: asking for more is refused; asking for nothing gets the cap, sent on.
    let greedy = json!({"model": "qwen3", "text": "x", "sampling_params": {"max_new_tokens": 9}});
    assert_eq!(post(&url, Some("sk-small"), &greedy).await.status, 400);
    let modest = json!({"model": "qwen3", "text": "x"});
    assert_eq!(post(&url, Some("sk-small"), &modest).await.status, 200);
    assert_eq!(
        generations(&b).last().unwrap().body["sampling_params"]["max_new_tokens"],
        8
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn keys_come_from_hashes_env_and_file_and_reload_revokes_without_restart() {
    let engine = slow_engine(WINDOW as usize, 20).await;
    let dir = std::env::temp_dir().join(format!("kvgate-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys_file = dir.join("team.keys");
    std::fs::write(&keys_file, "# team keys\nsk-file-1\n\nsk-file-2\n").unwrap();
    // Each test binary is its own process: this variable is ours alone.
    std::env::set_var("KVGATE_TEST_KEYS", "sk-env-1, sk-env-2");
    std::env::set_var("KVGATE_TEST_ADMIN_TOKEN", "admin-secret");
    let pools =
        pool("a", "qwen3", engine.http_addr, "") + &pool("l", "qwen3-large", engine.http_addr, "");
    let tenants_with = |revoked: bool| {
        format!(
            "[[tenants]]\nname = \"team\"\napi_key_sha256 = [{}]\napi_keys_env = \"KVGATE_TEST_KEYS\"\napi_keys_file = \"{}\"\n",
            if revoked { String::new() } else { format!("\"{}\"", hash("sk-hash")) },
            keys_file.display()
        )
    };
    let config_path = dir.join("kvgate.toml");
    // Tokenizer paths are relative to the config file: point them at the repo.
    let write = |revoked: bool| {
        let text = config(&pools, &tenants_with(revoked)).replace(
            "tokenizers/",
            &format!("{}/config/tokenizers/", repo().display()),
        );
        std::fs::write(&config_path, text).unwrap();
    };
    write(false);
    let cfg = kvgate::config::Config::load(&config_path).unwrap();
    let gw = kvgate::runtime::Gateway::new(cfg)
        .unwrap()
        .start(bind().await, bind().await)
        .await
        .unwrap();
    let url = format!("http://{}/generate", gw.data_addr());
    for key in ["sk-hash", "sk-env-1", "sk-env-2", "sk-file-1", "sk-file-2"] {
        assert_eq!(
            post(&url, Some(key), &gen("qwen3")).await.status,
            200,
            "{key}"
        );
    }
    // x-api-key works too.
    let mut req = request(http::Method::POST, &url, None, gen("qwen3").to_string());
    req.headers_mut()
        .insert("x-api-key", "sk-env-1".parse().unwrap());
    assert_eq!(send(req).await.status(), 200);

    // A stream in flight on the key about to be revoked.
    let body = json!({"model": "qwen3", "text": "slow ".repeat(20), "stream": true, "sampling_params": {"max_new_tokens": 30}});
    let in_flight = send(request(
        http::Method::POST,
        &url,
        Some("sk-hash"),
        body.to_string(),
    ))
    .await;
    assert_eq!(in_flight.status(), 200);

    write(true);
    // Reload is a mutating admin route: without the admin token it is refused.
    for key in [None, Some("sk-file-1")] {
        let refused = read(
            send(request(
                http::Method::POST,
                &format!("http://{}/reload", gw.admin_addr()),
                key,
                "",
            ))
            .await,
        )
        .await;
        assert_eq!(refused.status, 401, "{}", refused.text());
    }
    assert_eq!(
        post(&url, Some("sk-hash"), &gen("qwen3")).await.status,
        200,
        "a refused reload changed nothing"
    );
    let reload = read(
        send(request(
            http::Method::POST,
            &format!("http://{}/reload", gw.admin_addr()),
            Some("admin-secret"),
            "",
        ))
        .await,
    )
    .await;
    assert_eq!(reload.status, 200, "{}", reload.text());
    assert_eq!(
        post(&url, Some("sk-hash"), &gen("qwen3")).await.status,
        401,
        "revoked key refused"
    );
    assert_eq!(
        post(&url, Some("sk-file-1"), &gen("qwen3")).await.status,
        200,
        "other keys stay"
    );
    let rest = read(in_flight).await;
    assert_eq!(
        sse_data(&rest.text()).last().map(String::as_str),
        Some("[DONE]"),
        "the in-flight stream finished"
    );

    // An invalid file is refused and the running keys stay.
    std::fs::write(&config_path, "this is not toml = [").unwrap();
    let bad = read(
        send(request(
            http::Method::POST,
            &format!("http://{}/reload", gw.admin_addr()),
            Some("admin-secret"),
            "",
        ))
        .await,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        post(&url, Some("sk-file-2"), &gen("qwen3")).await.status,
        200
    );
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}
