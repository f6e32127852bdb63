use super::*;
use std::time::Duration;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every shipped config and every `config/fixtures/valid` file loads.
#[test]
fn shipped_and_valid_fixture_configs_load() {
    let mut files = vec![
        repo().join("config/example.toml"),
        repo().join("config/demo.toml"),
        repo().join("config/incident.toml"),
    ];
    for entry in std::fs::read_dir(repo().join("config/fixtures/valid")).unwrap() {
        files.push(entry.unwrap().path());
    }
    for file in files {
        if let Err(e) = Config::load(&file) {
            panic!("{} should load: {e}", file.display());
        }
    }
}

/// Every `config/fixtures/invalid` file fails, naming the key its first line expects
/// (`# expect: <key>`).
#[test]
fn invalid_fixture_configs_name_the_offending_key() {
    let dir = repo().join("config/fixtures/invalid");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks a `# expect: key` first line", path.display()))
            .trim()
            .to_owned();
        // Anchor relative paths at config/ so fixtures can name the shipped tokenizers.
        let anchor = repo().join("config").join(path.file_name().unwrap());
        let err = Config::from_toml(&text, &anchor)
            .err()
            .unwrap_or_else(|| panic!("{} should be rejected", path.display()));
        let key = match &err {
            ConfigError::Parse { key, .. } | ConfigError::Invalid { key, .. } => key.clone(),
            ConfigError::Io { .. } => String::new(),
        };
        assert_eq!(key, expected, "{}: {err}", path.display());
        seen += 1;
    }
    assert!(
        seen >= 10,
        "expected at least 10 invalid fixtures, found {seen}"
    );
}

#[test]
fn defaults_fill_the_server_section() {
    let text = r#"
        [server]
        allow_anonymous = true
        [[models]]
        name = "m"
        tokenizer = "tokenizers/qwen3/tokenizer.json"
        context_window = 4096
        [[pools]]
        name = "p"
        model = "m"
        engine = "sglang"
        mode = "unified"
        workers = [{ url = "http://127.0.0.1:1", kv_tokens = 4096 }]
    "#;
    let cfg = Config::from_toml(text, &repo().join("config/inline.toml")).unwrap();
    assert_eq!(cfg.server.max_body_bytes.as_u64(), 64 * 1024 * 1024);
    assert_eq!(cfg.server.drain_timeout, Duration::from_secs(30));
    assert_eq!(cfg.pools[0].weight, 100);
    assert!(cfg.models[0].tokenizer.is_absolute());
}

const ONE_TENANT: &str = r#"
    [[models]]
    name = "m"
    tokenizer = "tokenizers/qwen3/tokenizer.json"
    context_window = 4096
    [[pools]]
    name = "p"
    model = "m"
    engine = "sglang"
    mode = "unified"
    workers = [{ url = "http://127.0.0.1:1", kv_tokens = 4096 }]
    [[tenants]]
    name = "t"
    api_key_sha256 = ["2dfed5a298869fa9315da696048c1321c7fd5a8eb0098a2a7dcfbd7793660871"]
"#;

#[test]
fn scheduling_and_tenant_priorities_default() {
    let cfg = Config::from_toml(ONE_TENANT, &repo().join("config/inline.toml")).unwrap();
    assert_eq!(cfg.scheduling, SchedulingConfig::default());
    assert!(cfg.scheduling.enabled);
    assert_eq!(cfg.scheduling.max_queued, 256);
    assert_eq!(cfg.scheduling.queue_timeout, Duration::from_secs(30));
    assert_eq!(cfg.scheduling.kv_overcommit, 1.0);
    let t = &cfg.tenants[0];
    assert_eq!((t.weight, t.priority), (1, Priority::Standard));
    assert_eq!(
        t.max_priority(),
        Priority::Standard,
        "max_priority defaults to priority"
    );
}

#[test]
fn prefix_routing_defaults_and_parses() {
    let cfg = Config::from_toml(ONE_TENANT, &repo().join("config/inline.toml")).unwrap();
    let p = &cfg.prefix_routing;
    assert!(p.enabled);
    assert_eq!((p.block_size, p.max_blocks), (16, 262_144));
    assert_eq!(p.balance_margin, 0.25);
    assert_eq!(p.max_age, Duration::from_secs(600));
    assert!(p.share_with_replicas);
    let text = format!(
        "[prefix_routing]\nenabled = false\nblock_size = 64\nbalance_margin = 0.5\nmax_blocks = 1000\nmax_age = \"90s\"\nshare_with_replicas = false\n{ONE_TENANT}"
    );
    let cfg = Config::from_toml(&text, &repo().join("config/inline.toml")).unwrap();
    let p = &cfg.prefix_routing;
    assert!(!p.enabled);
    assert_eq!((p.block_size, p.max_blocks), (64, 1000));
    assert_eq!(p.balance_margin, 0.5);
    assert_eq!(p.max_age, Duration::from_secs(90));
    assert!(!p.share_with_replicas);
}

#[test]
fn tenant_priorities_parse_and_a_low_maximum_names_the_fix() {
    let text = format!(
        "[scheduling]\nmax_queued = 8\nqueue_timeout = \"2s\"\nkv_overcommit = 1.25\n{ONE_TENANT}weight = 3\npriority = \"sheddable\"\nmax_priority = \"critical\"\n"
    );
    let cfg = Config::from_toml(&text, &repo().join("config/inline.toml")).unwrap();
    assert_eq!(cfg.scheduling.max_queued, 8);
    assert_eq!(cfg.scheduling.queue_timeout, Duration::from_secs(2));
    let t = &cfg.tenants[0];
    assert_eq!(
        (t.weight, t.priority, t.max_priority()),
        (3, Priority::Sheddable, Priority::Critical)
    );

    let text = format!("{ONE_TENANT}priority = \"critical\"\nmax_priority = \"sheddable\"\n");
    let err = Config::from_toml(&text, &repo().join("config/inline.toml")).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("tenants[0].max_priority"), "{message}");
    assert!(
        message.contains("raise `max_priority` to at least `critical`"),
        "{message}"
    );
}
