//! Cross-field rules of the config, checked once at load (pingora's `validate(self)`).
//!
//! Each failure is a [`ConfigError::Invalid`] naming the key path and the fix.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::{Config, ConfigError, EngineKind, PoolMode, WorkerConfig};

/// Resolve relative paths against the config file and check every cross-field rule.
pub fn validate(mut config: Config) -> Result<Config, ConfigError> {
    let file = config.source.clone();
    let base = config.base_dir().to_owned();
    let invalid = |key: String, reason: String| ConfigError::Invalid {
        path: file.clone(),
        key,
        reason,
    };

    if config.server.max_body_bytes.as_u64() == 0 {
        return Err(invalid(
            "server.max_body_bytes".into(),
            "must be positive, e.g. \"64MiB\"".into(),
        ));
    }
    check_limits(&config).map_err(|(key, reason)| invalid(key, reason))?;
    if config.server.admin_token_env.is_some() && config.server.admin_token_file.is_some() {
        return Err(invalid(
            "server.admin_token_file".into(),
            "set admin_token_env or admin_token_file, not both".into(),
        ));
    }
    if let Some(f) = config.server.admin_token_file.as_mut() {
        *f = existing_file(&base, f).map_err(|r| invalid("server.admin_token_file".into(), r))?;
    }
    if let Some(tls) = config.server.tls.as_mut() {
        tls.cert =
            existing_file(&base, &tls.cert).map_err(|r| invalid("server.tls.cert".into(), r))?;
        tls.key =
            existing_file(&base, &tls.key).map_err(|r| invalid("server.tls.key".into(), r))?;
    }
    if config.server.tls_watch_interval.is_zero() {
        return Err(invalid(
            "server.tls_watch_interval".into(),
            "must be above 0, e.g. \"5s\"".into(),
        ));
    }
    super::upstream::check_tls(&mut config, &base).map_err(|(key, reason)| invalid(key, reason))?;

    if config.audit.sink == super::AuditSink::File && config.audit.path.is_none() {
        return Err(invalid(
            "audit.path".into(),
            "audit.sink = \"file\" needs a path, e.g. path = \"/var/log/kvgate/audit.jsonl\""
                .into(),
        ));
    }
    if config.isolation.ngram == 0
        || config.isolation.min_matches == 0
        || config.isolation.max_entries == 0
    {
        return Err(invalid(
            "isolation".into(),
            "ngram, min_matches and max_entries must be at least 1".into(),
        ));
    }
    if config.limits.backend == super::LimitsBackend::Redis && config.limits.redis_url.is_none() {
        return Err(invalid(
            "limits.redis_url".into(),
            "backend = \"redis\" needs redis_url, e.g. \"redis://10.0.0.9:6379/0\"".into(),
        ));
    }
    if config.admission.max_concurrent_counts == Some(0) {
        return Err(invalid(
            "admission.max_concurrent_counts".into(),
            "must be at least 1, or left out to use one per CPU core".into(),
        ));
    }
    if config.models.is_empty() {
        return Err(invalid(
            "models".into(),
            "no model is configured; add a [[models]] table with name, tokenizer and context_window"
                .into(),
        ));
    }
    let mut model_names = HashSet::new();
    for (i, model) in config.models.iter_mut().enumerate() {
        let key = |field: &str| format!("models[{i}].{field}");
        if model.name.trim().is_empty() {
            return Err(invalid(key("name"), "must not be empty".into()));
        }
        if !model_names.insert(model.name.clone()) {
            return Err(invalid(
                key("name"),
                format!(
                    "`{}` is defined twice; model names must be unique",
                    model.name
                ),
            ));
        }
        if model.context_window == 0 {
            return Err(invalid(
                key("context_window"),
                "must be the model's context window in tokens, e.g. 131072".into(),
            ));
        }
        if model.default_max_new_tokens == Some(0) {
            return Err(invalid(
                key("default_max_new_tokens"),
                "must be at least 1, or left out to use the engines' defaults".into(),
            ));
        }
        if let Some(v) = &model.min_engine_version {
            super::EngineVersion::parse(v)
                .map_err(|e| invalid(key("min_engine_version"), e.to_string()))?;
        }
        model.tokenizer =
            existing_file(&base, &model.tokenizer).map_err(|r| invalid(key("tokenizer"), r))?;
        if let Some(t) = model.chat_template.as_mut() {
            *t = existing_file(&base, t).map_err(|r| invalid(key("chat_template"), r))?;
        }
    }

    let mut pool_names = HashSet::new();
    for (i, pool) in config.pools.iter().enumerate() {
        let key = |field: &str| format!("pools[{i}].{field}");
        if pool.name.trim().is_empty() {
            return Err(invalid(key("name"), "must not be empty".into()));
        }
        if !pool_names.insert(pool.name.clone()) {
            return Err(invalid(
                key("name"),
                format!(
                    "`{}` is defined twice; pool names must be unique",
                    pool.name
                ),
            ));
        }
        if !model_names.contains(&pool.model) {
            return Err(invalid(
                key("model"),
                format!(
                    "`{}` is not a [[models]] name; use one of: {}",
                    pool.model,
                    sorted(&model_names)
                ),
            ));
        }
        match pool.mode {
            PoolMode::Unified => {
                if pool.workers.is_empty() {
                    return Err(invalid(
                        key("workers"),
                        "a unified pool needs at least one worker: workers = [{ url = \"http://...\" }]"
                            .into(),
                    ));
                }
                if !pool.prefill.is_empty() || !pool.decode.is_empty() {
                    return Err(invalid(
                        key("prefill"),
                        "prefill/decode lists belong to mode = \"disaggregated\"; a unified pool lists `workers`".into(),
                    ));
                }
            }
            PoolMode::Disaggregated => {
                if pool.engine == EngineKind::Openai {
                    return Err(invalid(
                        key("mode"),
                        "engine = \"openai\" pools are unified; prefill/decode disaggregation needs engine = \"sglang\"".into(),
                    ));
                }
                if pool.prefill.is_empty() || pool.decode.is_empty() {
                    return Err(invalid(
                        key(if pool.prefill.is_empty() {
                            "prefill"
                        } else {
                            "decode"
                        }),
                        "a disaggregated pool needs at least one prefill and one decode worker"
                            .into(),
                    ));
                }
                if !pool.workers.is_empty() {
                    return Err(invalid(
                        key("workers"),
                        "`workers` belongs to mode = \"unified\"; list prefill and decode instead"
                            .into(),
                    ));
                }
            }
        }
        for (j, pattern) in pool.guard.marker_patterns.iter().enumerate() {
            if let Err(e) = regex::Regex::new(pattern) {
                return Err(invalid(
                    key(&format!("guard.marker_patterns[{j}]")),
                    format!("not a valid regular expression: {e}"),
                ));
            }
        }
        if pool.guard.markers.iter().any(String::is_empty) {
            return Err(invalid(
                key("guard.markers"),
                "an empty marker would match every answer; remove it".into(),
            ));
        }
        for (list, workers) in [
            ("workers", &pool.workers),
            ("prefill", &pool.prefill),
            ("decode", &pool.decode),
        ] {
            for (j, worker) in workers.iter().enumerate() {
                check_worker(worker, list == "prefill")
                    .map_err(|(field, r)| invalid(key(&format!("{list}[{j}].{field}")), r))?;
            }
        }
    }
    for model in &model_names {
        if !config.pools.iter().any(|p| &p.model == model) {
            return Err(invalid(
                "pools".into(),
                format!(
                    "model `{model}` has no pool; add a [[pools]] table with model = \"{model}\""
                ),
            ));
        }
    }

    let mut tenant_names = HashSet::new();
    let mut key_hashes = HashSet::new();
    for (i, tenant) in config.tenants.iter_mut().enumerate() {
        let key = |field: &str| format!("tenants[{i}].{field}");
        if tenant.name.trim().is_empty() {
            return Err(invalid(key("name"), "must not be empty".into()));
        }
        if !tenant_names.insert(tenant.name.clone()) {
            return Err(invalid(
                key("name"),
                format!(
                    "`{}` is defined twice; tenant names must be unique",
                    tenant.name
                ),
            ));
        }
        for (field, value) in [
            ("max_prompt_tokens", tenant.max_prompt_tokens),
            ("max_new_tokens", tenant.max_new_tokens),
        ] {
            if value == Some(0) {
                return Err(invalid(
                    key(field),
                    "must be at least 1, or left out for no cap".into(),
                ));
            }
        }
        for (j, model) in tenant.models.iter().enumerate() {
            if !model_names.contains(model) {
                return Err(invalid(
                    key(&format!("models[{j}]")),
                    format!(
                        "`{model}` is not a [[models]] name; use one of: {}",
                        sorted(&model_names)
                    ),
                ));
            }
        }
        for (j, pool) in tenant.pools.iter().enumerate() {
            if !pool_names.contains(pool) {
                return Err(invalid(
                    key(&format!("pools[{j}]")),
                    format!(
                        "`{pool}` is not a [[pools]] name; use one of: {}",
                        sorted(&pool_names)
                    ),
                ));
            }
        }
        if let Some(file) = tenant.api_keys_file.as_mut() {
            *file = existing_file(&base, file).map_err(|r| invalid(key("api_keys_file"), r))?;
        }
        let loaded = load_keys(tenant).map_err(|(field, reason)| invalid(key(field), reason))?;
        tenant.api_key_sha256.extend(loaded);
        for (j, hash) in tenant.api_key_sha256.iter_mut().enumerate() {
            *hash = hash.to_ascii_lowercase();
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(
                    key(&format!("api_key_sha256[{j}]")),
                    "must be 64 hex digits: the SHA-256 of the key (`kvgate hash-key`, or `printf %s KEY | sha256sum`)".into(),
                ));
            }
            if !key_hashes.insert(hash.clone()) {
                return Err(invalid(
                    key(&format!("api_key_sha256[{j}]")),
                    "this key hash is listed twice; each API key belongs to one tenant".into(),
                ));
            }
        }
    }
    for (i, pool) in config.pools.iter().enumerate() {
        for (j, tenant) in pool.tenants.iter().enumerate() {
            if !tenant_names.contains(tenant) {
                return Err(invalid(
                    format!("pools[{i}].tenants[{j}]"),
                    format!("`{tenant}` is not a [[tenants]] name"),
                ));
            }
        }
    }
    super::rollout::check(&config).map_err(|(key, reason)| invalid(key, reason))?;
    super::health::check(&config).map_err(|(key, reason)| invalid(key, reason))?;
    super::preflight::check(&config.preflight).map_err(|(key, reason)| invalid(key, reason))?;
    super::tracing::check(&config.tracing).map_err(|(key, reason)| invalid(key, reason))?;
    if key_hashes.is_empty() && !config.server.allow_anonymous {
        return Err(invalid(
            "tenants".into(),
            "no tenant has an API key, so every request would get 401; add [[tenants]] with api_key_sha256, or set server.allow_anonymous = true".into(),
        ));
    }
    Ok(config)
}

/// Keys named by `api_keys_env` / `api_keys_file`, hashed (the keys themselves are dropped).
fn load_keys(tenant: &super::TenantConfig) -> Result<Vec<String>, (&'static str, String)> {
    let mut keys = Vec::new();
    if let Some(var) = &tenant.api_keys_env {
        let value = std::env::var(var).map_err(|_| {
            ("api_keys_env", format!("environment variable `{var}` is not set (or not UTF-8); export it or remove the key"))
        })?;
        keys.extend(
            value
                .split([',', '\n'])
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_owned),
        );
    }
    if let Some(path) = &tenant.api_keys_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            (
                "api_keys_file",
                format!("cannot read {}: {e}", path.display()),
            )
        })?;
        keys.extend(
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(str::to_owned),
        );
    }
    Ok(keys.iter().map(|k| super::hash_key(k)).collect())
}

fn check_worker(worker: &WorkerConfig, is_prefill: bool) -> Result<(), (&'static str, String)> {
    match worker.url.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err((
                "url",
                "must start with http:// or https://, e.g. \"http://10.0.0.1:30000\"".into(),
            ))
        }
    }
    if worker.url.host().is_none() {
        return Err((
            "url",
            "must name a host, e.g. \"http://10.0.0.1:30000\"".into(),
        ));
    }
    if !matches!(worker.url.path(), "" | "/") || worker.url.query().is_some() {
        return Err(("url", "must be a base URL without a path or query".into()));
    }
    if worker.kv_tokens == Some(0) {
        return Err((
            "kv_tokens",
            "must be the KV pool size in tokens (SGLang's max_total_num_tokens), or left out to discover it".into(),
        ));
    }
    if !is_prefill && (worker.bootstrap_port.is_some() || worker.bootstrap_host.is_some()) {
        return Err((
            "bootstrap_port",
            "only prefill workers have a KV bootstrap server; remove it here".into(),
        ));
    }
    Ok(())
}

/// Deadlines and ceilings: zero would turn a guard off or refuse everything, and the
/// buffer budget must hold at least one largest request.
fn check_limits(config: &Config) -> Result<(), (String, String)> {
    let (server, upstream) = (&config.server, &config.upstream);
    let durations = [
        ("server.header_read_timeout", server.header_read_timeout),
        ("server.body_idle_timeout", server.body_idle_timeout),
        ("server.body_timeout", server.body_timeout),
        ("server.send_timeout", server.send_timeout),
        (
            "server.http2_keep_alive_interval",
            server.http2_keep_alive_interval,
        ),
        (
            "server.http2_keep_alive_timeout",
            server.http2_keep_alive_timeout,
        ),
        ("upstream.connect_timeout", upstream.connect_timeout),
        (
            "upstream.response_header_timeout",
            upstream.response_header_timeout,
        ),
        ("upstream.stream_idle_timeout", upstream.stream_idle_timeout),
        ("upstream.request_timeout", upstream.request_timeout),
    ];
    // Deadlines are added to the clock on every request: a year-long value would overflow.
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);
    for (key, value) in durations {
        if value.is_zero() {
            return Err((key.to_owned(), "must be positive, e.g. \"10s\"".into()));
        }
        if value > LONGEST {
            return Err((key.to_owned(), "must be at most 7 days".into()));
        }
    }
    let counts = [
        ("server.max_connections", server.max_connections),
        ("server.data_threads", server.data_threads),
        ("server.max_in_flight", server.max_in_flight),
        (
            "server.http2_max_concurrent_streams",
            server.http2_max_concurrent_streams as usize,
        ),
    ];
    for (key, value) in counts {
        if value == 0 {
            return Err((key.to_owned(), "must be at least 1".into()));
        }
    }
    if server.max_header_bytes.as_u64() < 1024 {
        return Err((
            String::from("server.max_header_bytes"),
            "must be at least \"1KiB\"".into(),
        ));
    }
    if server.max_header_value_bytes.as_u64() == 0
        || server.max_header_value_bytes > server.max_header_bytes
    {
        return Err((
            "server.max_header_value_bytes".to_owned(),
            "must be positive and at most server.max_header_bytes".into(),
        ));
    }
    let largest = server.max_body_bytes.max(upstream.max_response_bytes);
    if server.max_buffered_bytes < largest {
        return Err((
            "server.max_buffered_bytes".to_owned(),
            format!("must hold at least one largest request body or answer ({largest}); raise it or lower server.max_body_bytes / upstream.max_response_bytes"),
        ));
    }
    if upstream.max_response_bytes.as_u64() == 0 {
        return Err((
            String::from("upstream.max_response_bytes"),
            "must be positive, e.g. \"64MiB\"".into(),
        ));
    }
    if !(0.0..=1.0).contains(&upstream.retry_budget_ratio) {
        return Err((
            "upstream.retry_budget_ratio".to_owned(),
            "must be between 0 and 1 (0.1: one retry per ten requests)".into(),
        ));
    }
    for (i, pool) in config.pools.iter().enumerate() {
        if pool.max_in_flight == Some(0) {
            return Err((
                format!("pools[{i}].max_in_flight"),
                "must be at least 1, or left out for no pool cap".into(),
            ));
        }
    }
    for (i, tenant) in config.tenants.iter().enumerate() {
        for name in &tenant.lora_adapters {
            super::AdapterName::parse(name)
                .map_err(|e| (format!("tenants[{i}].lora_adapters"), e.to_string()))?;
        }
    }
    Ok(())
}

pub(super) fn existing_file(base: &Path, path: &Path) -> Result<PathBuf, String> {
    let resolved = if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    };
    if resolved.is_file() {
        Ok(resolved)
    } else {
        Err(format!(
            "file {} does not exist (relative paths are resolved against the config file's folder)",
            resolved.display()
        ))
    }
}

fn sorted(set: &HashSet<String>) -> String {
    let mut v: Vec<&str> = set.iter().map(String::as_str).collect();
    v.sort_unstable();
    v.join(", ")
}
