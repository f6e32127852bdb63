//! The Kubernetes deployment (`deploy/kubernetes/`) against the gateway's real config loader.
//!
//! `kvgate.toml` there becomes the ConfigMap mounted at `/etc/kvgate/kvgate.toml`, beside the
//! tokenizers the Dockerfile copies from `config/` to `/etc/kvgate/`; so the file is loaded
//! here as if it lived in `config/` (relative paths resolve the same way), with the files the
//! Secret provides (`/run/secrets/kvgate/...`) written to a temporary folder. The manifests
//! are read as plain text: no YAML crate, only the lines the config depends on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kvgate::config::{hash_key, Config, LimitsBackend};

const SECRETS_DIR: &str = "/run/secrets/kvgate/";
const TEST_ADMIN_TOKEN: &str = "test-admin-token";
const TEST_ACME_KEY: &str = "test-acme-key";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn k8s() -> PathBuf {
    repo().join("deploy/kubernetes")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The value of the first `key: value` line in a manifest (comments and quotes stripped).
fn yaml_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("").trim();
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        Some(rest.trim().trim_matches('"').to_owned())
    })
}

/// A folder standing in for the Secret's volume: the files `kvgate.toml` names under
/// `/run/secrets/kvgate/`, with test values.
fn secrets_dir() -> PathBuf {
    // One folder per call: tests run in parallel, and one removing its folder must not take
    // another's files away.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kvgate-deploy-test-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("admin-token"), format!("{TEST_ADMIN_TOKEN}\n")).unwrap();
    std::fs::write(
        dir.join("acme.keys"),
        format!("# test keys\n{TEST_ACME_KEY}\n"),
    )
    .unwrap();
    dir
}

/// `deploy/kubernetes/kvgate.toml`, loaded as `/etc/kvgate/kvgate.toml` (= `config/`), with
/// the Secret's files and environment variables set to test values.
fn load_k8s_config() -> (Config, PathBuf) {
    let text = read(&k8s().join("kvgate.toml"));
    assert!(
        text.contains(SECRETS_DIR),
        "kvgate.toml should read its secrets from {SECRETS_DIR} (the Secret's mount)"
    );
    let secrets = secrets_dir();
    let text = text.replace(SECRETS_DIR, &format!("{}/", secrets.display()));
    // The Deployment sets this from the Secret; the loader does not need it, the gateway does.
    std::env::set_var("KVGATE_SALT_SECRET", "test-salt-secret");
    let config = Config::from_toml(&text, &repo().join("config/kvgate.toml"))
        .unwrap_or_else(|e| panic!("deploy/kubernetes/kvgate.toml does not load: {e}"));
    (config, secrets)
}

#[test]
fn k8s_config_loads_with_the_secret_and_shares_state_through_redis() {
    let (config, secrets) = load_k8s_config();
    let deployment = read(&k8s().join("deployment.yaml"));
    let redis = read(&k8s().join("redis.yaml"));

    // Both ports on every interface: the Service reaches the data port, the kubelet's probes
    // the admin port, on the pod's IP.
    assert!(
        config.server.listen.ip().is_unspecified(),
        "{}",
        config.server.listen
    );
    assert!(
        config.server.admin_listen.ip().is_unspecified(),
        "{}",
        config.server.admin_listen
    );
    for (name, port) in [
        ("http", config.server.listen.port()),
        ("admin", config.server.admin_listen.port()),
    ] {
        assert!(
            deployment.contains(&format!(
                "- name: {name}\n              containerPort: {port}"
            )),
            "deployment.yaml should declare container port {name} = {port}"
        );
    }
    assert!(deployment.contains("path: /ready") && deployment.contains("path: /health"));

    // Shared limits and rollout decisions: Redis, at the Service redis.yaml defines.
    assert_eq!(config.limits.backend, LimitsBackend::Redis);
    let url = config.limits.redis_url.as_deref().expect("redis_url");
    let host = url
        .strip_prefix("redis://")
        .and_then(|rest| rest.split([':', '/']).next())
        .expect("redis://host:port/db");
    assert!(
        redis.contains(&format!("kind: Service\nmetadata:\n  name: {host}")),
        "redis_url names host `{host}`, which redis.yaml should define as a Service"
    );
    assert!(
        !config.rollouts.is_empty(),
        "the canary rollout (shared through Redis)"
    );

    // The tokenizers resolve to config/tokenizers, which the image ships at /etc/kvgate/.
    let dockerfile = read(&repo().join("Dockerfile"));
    assert!(
        dockerfile.contains("COPY config/ /etc/kvgate/"),
        "the Dockerfile's config copy moved"
    );
    assert!(deployment
        .contains("mountPath: /etc/kvgate/kvgate.toml\n              subPath: kvgate.toml"));
    for model in &config.models {
        let files = std::iter::once(&model.tokenizer).chain(model.chat_template.as_ref());
        for file in files {
            assert!(
                file.starts_with(repo().join("config/tokenizers")),
                "{}",
                file.display()
            );
            assert!(file.is_file(), "{} is missing", file.display());
        }
    }

    // The Secret's files: the admin token and the tenant's keys, hashed at load.
    let token_file = config
        .server
        .admin_token_file
        .as_ref()
        .expect("admin_token_file");
    assert_eq!(token_file, &secrets.join("admin-token"));
    let acme = config
        .tenants
        .iter()
        .find(|t| t.name == "acme")
        .expect("tenant acme");
    assert!(acme.api_key_sha256.contains(&hash_key(TEST_ACME_KEY)));
    assert!(deployment.contains(&format!("mountPath: {}", SECRETS_DIR.trim_end_matches('/'))));
    for file in ["admin-token", "acme.keys"] {
        assert!(
            deployment.contains(&format!("- key: {file}\n                path: {file}")),
            "deployment.yaml should project the Secret's key {file}"
        );
    }
    let salt_env = config
        .isolation
        .salt_secret_env
        .as_deref()
        .expect("salt_secret_env");
    assert!(
        deployment.contains(&format!("- name: {salt_env}")),
        "the Deployment sets {salt_env}"
    );

    // SIGTERM: preStop, then drain_timeout, all inside the grace period.
    let grace: u64 = yaml_value(&deployment, "terminationGracePeriodSeconds")
        .expect("terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    let pre_stop = Duration::from_secs(5);
    assert!(deployment.contains(r#"command: ["/bin/sleep", "5"]"#));
    assert!(
        Duration::from_secs(grace) > pre_stop + config.server.drain_timeout,
        "terminationGracePeriodSeconds {grace} must exceed preStop 5s + drain_timeout {:?}",
        config.server.drain_timeout
    );

    std::fs::remove_dir_all(secrets).ok();
}

#[test]
fn kustomization_lists_every_manifest() {
    let kustomization = read(&k8s().join("kustomization.yaml"));
    let mut listed = 0;
    for entry in std::fs::read_dir(k8s()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" {
            continue;
        }
        // An entry line, not a commented-out one.
        let entry = format!("- {name}");
        let listed_here = kustomization.lines().any(|l| l.trim() == entry);
        if name.ends_with(".example.yaml") {
            assert!(!listed_here, "{name} holds placeholders: never apply it");
        } else {
            assert!(listed_here, "kustomization.yaml does not list {name}");
            listed += 1;
        }
    }
    assert!(
        listed >= 6,
        "deployment, service, pdb, redis, networkpolicy, namespace"
    );
    assert!(
        kustomization.contains("- name: kvgate-config\n    files:\n      - kvgate.toml\n"),
        "the ConfigMap is generated from kvgate.toml"
    );
}

/// The engines' Services (`engines/services.yaml`) as the manifests' lines: each document's
/// `name:` (the first one, metadata), whether it is headless, and its named ports.
fn engine_services() -> Vec<(String, bool, bool, Vec<String>)> {
    let text = read(&k8s().join("engines/services.yaml"));
    text.split("\n---")
        .filter(|doc| doc.contains("kind: Service"))
        .map(|doc| {
            // The first `name:` of a document is its metadata's.
            let name = doc
                .lines()
                .find_map(|l| l.trim().strip_prefix("name: ").map(str::to_owned))
                .unwrap_or_default();
            let headless = doc.lines().any(|l| l.trim() == "clusterIP: None");
            let ready_only = doc
                .lines()
                .any(|l| l.trim() == "publishNotReadyAddresses: false");
            let ports = doc
                .lines()
                .filter_map(|l| l.trim().strip_prefix("- name: ").map(str::to_owned))
                .collect();
            (name, headless, ready_only, ports)
        })
        .collect()
}

/// Every `discover` name in kvgate.toml is a headless Service of engines/services.yaml that
/// lists only ready pods (a named port for SRV names), and the engines' kustomization
/// applies that file.
#[test]
fn discovered_engines_are_headless_services_listing_ready_pods() {
    let (config, secrets) = load_k8s_config();
    std::fs::remove_dir_all(secrets).ok();
    let services = engine_services();
    assert!(services.len() >= 2, "{services:?}");
    for (name, headless, ready_only, ports) in &services {
        assert!(headless, "{name}: a headless Service (clusterIP: None)");
        assert!(ready_only, "{name}: publishNotReadyAddresses: false");
        assert!(
            ports.iter().any(|p| p == "http"),
            "{name}: a port named http"
        );
    }
    assert!(
        services.iter().any(
            |(n, _, _, ports)| n.ends_with("prefill") && ports.iter().any(|p| p == "bootstrap")
        ),
        "the prefill Service names its KV bootstrap port (SRV _bootstrap._tcp)"
    );
    let mut discovered = 0;
    for pool in &config.pools {
        for worker in pool.workers.iter().chain(&pool.prefill).chain(&pool.decode) {
            if worker.discover.is_none() {
                continue;
            }
            discovered += 1;
            let host = worker.url.host().unwrap();
            let service = host
                .split('.')
                .find(|label| !label.starts_with('_'))
                .unwrap();
            assert!(
                host.ends_with(".inference.svc.cluster.local"),
                "{host}: the engines' namespace"
            );
            assert!(
                services.iter().any(|(n, ..)| n == service),
                "{host}: no Service {service} in engines/services.yaml"
            );
        }
    }
    assert!(discovered >= 2, "every pool finds its engines by DNS");
    let kustomization = read(&k8s().join("engines/kustomization.yaml"));
    assert!(kustomization.lines().any(|l| l.trim() == "- services.yaml"));
    assert!(kustomization
        .lines()
        .any(|l| l.trim() == "namespace: inference"));
}
