//! The operator's side of a rollout, end to end: the admin API's token (401 without it, 403
//! when none is configured), a per-model `min_engine_version` (older workers never serve,
//! with the reason on `/ready` and in `kvgate check`), and draining a worker (in-flight
//! requests finish, new ones go elsewhere).

mod support;

use http::{Method, StatusCode};
use serde_json::{json, Value};

use kvgate_sim::{RunningSim, SimConfig, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const TOKEN_ENV: &str = "KVGATE_ROLLOUT_ADMIN_TEST_TOKEN";
const TOKEN: &str = "admin-api-test-token";

async fn versioned(version: &str) -> RunningSim {
    engine_with(SimConfig {
        role: SimRole::Unified,
        model: "qwen3".into(),
        kv_tokens: 40960,
        context_length: WINDOW as usize,
        version: version.into(),
        ..SimConfig::default()
    })
    .await
}

fn with_admin_token(config: String) -> String {
    // Every test of this binary sets the same value, so parallel tests cannot disagree.
    std::env::set_var(TOKEN_ENV, TOKEN);
    config.replace(
        "[server]\n",
        &format!("[server]\nadmin_token_env = \"{TOKEN_ENV}\"\n"),
    )
}

fn chat() -> Value {
    json!({"model": "qwen3", "max_tokens": 8, "messages": [{"role": "user", "content": "hello there"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_needs_the_admin_token() {
    let e = versioned("0.5.22").await;
    let pools = unified_pool("p", &[worker(&e, None)]);
    let gw = gateway(&with_admin_token(config_with_pools(WINDOW, &pools))).await;

    for (method, path) in [
        (Method::GET, "/pools"),
        (Method::GET, "/rollouts"),
        (Method::POST, "/pools/p/weight"),
    ] {
        let reply = admin(&gw, method.clone(), path, None).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(
            reply.json()["error"]["code"].is_string(),
            "{}",
            reply.text()
        );
        let reply = admin(&gw, method, path, Some("not-the-token")).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let reply = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let pool = &reply.json()["pools"][0];
    assert_eq!(pool["pool"], "p");
    assert_eq!(pool["workers"][0]["version"], "0.5.22");
    assert_eq!(pool["workers"][0]["kv_tokens"], 40960);
    assert_eq!(pool["workers"][0]["eligible"], true);

    // A weight must be a whole number; unknown pools and routes are named.
    let url = format!("http://{}/pools/p/weight", gw.admin_addr());
    for bad in ["{\"weight\": -1}", "{\"weight\": \"many\"}", "not json"] {
        let reply = read(send(request(Method::POST, &url, Some(TOKEN), bad)).await).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let reply = admin(&gw, Method::POST, "/pools/nope/weight", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert!(error_message(&reply).contains("nope"));
    let reply = admin(&gw, Method::POST, "/rollouts/qwen3/rollback", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "no rollout configured");

    // Without a configured token the API is off, not open.
    let open = gateway(&config_with_pools(WINDOW, &pools)).await;
    let reply = admin(&open, Method::GET, "/pools", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(error_code(&reply), "admin_token_not_configured");
    // A read is refused as a read: it would have mutated nothing (issue 40 item 5).
    let message = error_message(&reply);
    assert!(!message.contains("mutating"), "{message}");
    assert!(message.contains("reads included"), "{message}");
    let reply = admin(&open, Method::GET, "/pools", None).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(!error_message(&reply).contains("mutating"));
    let reply = admin(&open, Method::POST, "/pools/p/weight", Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(error_message(&reply).contains("mutating admin routes are off"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_older_than_min_engine_version_never_serve_and_say_why() {
    let old = versioned("0.5.19").await;
    let new = versioned("0.5.22").await;
    let pools = unified_pool("p", &[worker(&old, None), worker(&new, None)]);
    let config = config_with_pools(WINDOW, &pools).replace(
        "context_window = 40960\n",
        "context_window = 40960\nmin_engine_version = \"0.5.22\"\n",
    );
    let gw = gateway(&config).await;

    let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
    let text = ready.text();
    assert!(
        text.contains("engine version 0.5.19 is older than min_engine_version 0.5.22"),
        "{text}"
    );
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    for _ in 0..8 {
        let reply = post(&url, Some(KEY), &chat()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert!(generations(&old).is_empty(), "the old engine served");
    assert_eq!(generations(&new).len(), 8);

    // `kvgate check --discover` prints each worker's version and the reason.
    let dir = std::env::temp_dir().join(format!(
        "kvgate-min-version-{}-{}",
        std::process::id(),
        old.http_addr.port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("gateway.toml");
    let tokenizers = repo().join("config/tokenizers");
    std::fs::write(
        &file,
        config.replace("tokenizers/", &format!("{}/", tokenizers.display())),
    )
    .expect("write config");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvgate"))
            .args(["check", "--discover", "--config"])
            .arg(&file)
            .output()
            .expect("run kvgate check")
    })
    .await
    .expect("join");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("version 0.5.19"), "{stdout}");
    assert!(stdout.contains("version 0.5.22"), "{stdout}");
    assert!(
        stdout.contains("older than min_engine_version 0.5.22"),
        "{stdout}"
    );

    // A pool with only old engines is not ready, and says why.
    let only_old = unified_pool("p", &[worker(&old, None)]);
    let config = config_with_pools(WINDOW, &only_old).replace(
        "context_window = 40960\n",
        "context_window = 40960\nmin_engine_version = \"0.5.22\"\n",
    );
    let gw = gateway(&config).await;
    let ready = get(&format!("http://{}/ready", gw.admin_addr()), None).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(ready.text().contains("older than min_engine_version"));
    let reply = post(
        &format!("http://{}/v1/chat/completions", gw.data_addr()),
        Some(KEY),
        &chat(),
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert!(generations(&old).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_worker_finishes_in_flight_requests_and_gets_no_new_ones() {
    let a = slow_engine(WINDOW as usize, 40).await;
    let b = slow_engine(WINDOW as usize, 40).await;
    let pools = unified_pool("p", &[worker(&a, None), worker(&b, None)]);
    let gw = gateway(&with_admin_token(config_with_pools(WINDOW, &pools))).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());

    // A stream of ~1 s is in flight on one of the two workers...
    let body = json!({"model": "qwen3", "stream": true, "max_tokens": 24,
        "messages": [{"role": "user", "content": "tell me a story"}]});
    let in_flight = send(request(Method::POST, &url, Some(KEY), body.to_string())).await;
    assert_eq!(in_flight.status(), StatusCode::OK);
    let (busy, other) = if generations(&a).is_empty() {
        (&b, &a)
    } else {
        (&a, &b)
    };
    assert_eq!(generations(busy).len(), 1);
    // ...drain it.
    let path = format!("/pools/p/workers/{}/drain", busy.http_addr);
    let reply = admin(&gw, Method::POST, &path, Some(TOKEN)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["draining"], true);
    assert_eq!(reply.json()["outstanding"], 1);

    // New requests all go to the other worker while the stream runs to its end.
    for _ in 0..4 {
        let reply = post(&url, Some(KEY), &chat()).await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    }
    assert_eq!(generations(busy).len(), 1);
    assert_eq!(generations(other).len(), 4);
    let stream = read(in_flight).await;
    let events = stream.sse_data();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        stream.text()
    );
    assert!(!stream.text().contains("\"error\""), "{}", stream.text());

    // The pools listing says why it is out; undrain brings it back.
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    let listed = pools["pools"][0]["workers"]
        .as_array()
        .and_then(|w| w.iter().find(|w| w["draining"] == true))
        .cloned()
        .expect("a draining worker listed");
    assert_eq!(listed["eligible"], false);
    assert!(listed["reason"]
        .as_str()
        .is_some_and(|r| r.contains("draining")));
    let path = format!("/pools/p/workers/{}/undrain", busy.http_addr);
    admin(&gw, Method::POST, &path, Some(TOKEN)).await;
    for _ in 0..8 {
        post(&url, Some(KEY), &chat()).await;
    }
    assert!(
        generations(busy).len() > 1,
        "an undrained worker takes traffic again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_set_through_the_admin_api_survive_a_reload_and_the_file_stays_the_start() {
    let a = versioned("0.5.22").await;
    let b = versioned("0.5.22").await;
    let pools = format!(
        "{}\n{}",
        unified_pool("a", &[worker(&a, None)]),
        unified_pool("b", &[worker(&b, None)])
    );
    let text = with_admin_token(config_with_pools(WINDOW, &pools)).replace(
        "\"tokenizers/",
        &format!("\"{}/", repo().join("config/tokenizers").display()),
    );
    let dir = std::env::temp_dir().join(format!("kvgate-weights-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("kvgate.toml");
    std::fs::write(&path, &text).unwrap();
    let start = || async {
        let config = kvgate::config::Config::load(&path).unwrap();
        kvgate::runtime::Gateway::new(config)
            .unwrap()
            .start(bind().await, bind().await)
            .await
            .unwrap()
    };
    let weight_of = |pools: &Value, name: &str| {
        pools["pools"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["pool"] == name))
            .map(|p| p["weight"].clone())
            .unwrap_or(Value::Null)
    };
    let gw = start().await;
    let url = format!("http://{}/pools/b/weight", gw.admin_addr());
    let set = read(
        send(request(
            Method::POST,
            &url,
            Some(TOKEN),
            json!({"weight": 0}).to_string(),
        ))
        .await,
    )
    .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text());

    let reload = admin(&gw, Method::POST, "/reload", Some(TOKEN)).await;
    assert_eq!(reload.status, StatusCode::OK, "{}", reload.text());
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    assert_eq!(
        weight_of(&pools, "b"),
        0,
        "the admin change survives a reload"
    );
    let gen = format!("http://{}/v1/chat/completions", gw.data_addr());
    let before = generations(&b).len();
    for _ in 0..6 {
        assert_eq!(post(&gen, Some(KEY), &chat()).await.status, StatusCode::OK);
    }
    assert_eq!(generations(&b).len(), before, "weight 0 takes no traffic");
    gw.shutdown().await;

    // A restart starts from the file again.
    let gw = start().await;
    let pools = admin(&gw, Method::GET, "/pools", Some(TOKEN)).await.json();
    assert_eq!(weight_of(&pools, "b"), 100);
    gw.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
